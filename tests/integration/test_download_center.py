"""The download center against the software its users run: an Excel
template read back by openpyxl and converted by LibreOffice (CSV, PDF, the first page as a PNG
under var/), the synchronous download, temporary and permanent links, who may see what, the
time limit of an export, and the WebSocket events across two web processes."""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests

from common.store.clock import utcnow
from common.store.models import Export
from master.dispatch.dispatcher import dispatch_once
from master.exports import service as exports
from services import env_for
from slave.exporter import Stopped, _Progress, run_export
from tests.helpers import add_urls, burst_worker, cli, register
from tests.integration.test_exports import _file, _job_with_pages
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
REPORT = {
    "sheet": "report",
    "default_height": 18,
    "tables": [
        {
            "title": "Crawl report",
            "summary": "Pages of the sample site by answer, in the order they were added.",
            "header": {"Job": "dc", "Site": "sample"},
            "footer": {"Checked by": "ops", "Signature": " "},
            "col": [
                {"title": "Request", "children": [{"title": "URL", "name": "url", "width": 220}]},
                {
                    "title": "Response",
                    "children": [
                        {"title": "Status", "name": "status_code"},
                        {
                            "title": "Body",
                            "children": [
                                {"title": "Bytes", "name": "response_size", "format": "#,##0"},
                                {"title": "Charset", "name": "encoding"},
                            ],
                        },
                    ],
                },
                {"title": "Fetched", "name": "add_datetime", "format": "yyyy-mm-dd hh:mm"},
            ],
            "row_field": "status_code",
            "row": [
                {
                    "title": "Answered",
                    "children": [
                        {"title": "OK", "name": "200", "row_count": 3},
                        {"title": "Partial", "name": "203", "row_count": 2},
                    ],
                }
            ],
        },
        {
            "title": "All pages",
            "status": [200],
            "col": [
                {"title": "URL", "name": "url"},
                {"title": "Bytes", "name": "response_size", "format": "#,##0"},
            ],
        },
    ],
}


def _pages(cluster, tmp_path, name="dc"):
    """Four pages (200) and two other answers (203), fetched by a worker."""
    register(tmp_path, name)
    urls = [f"{cluster.site}/page/{i}" for i in range(4)] + [
        f"{cluster.site}/status/203?n={i}" for i in range(2)
    ]
    add_urls(name, urls)
    assert dispatch_once(cluster.redis).total == 6
    burst_worker(cluster, "--no-exports")
    return urls


def _soffice() -> str:
    found = shutil.which("soffice") or shutil.which("libreoffice")
    if not (found and shutil.which("pdftoppm") and shutil.which("pdftotext")):
        pytest.skip(
            "LibreOffice is not installed (make installs libreoffice-calc-nogui and poppler-utils as root)"
        )
    return found


def _convert(soffice: str, source: Path, to: str, tmp_path: Path, infilter: str | None = None) -> Path:
    profile = tmp_path / "lo-profile"
    reading = [f"--infilter={infilter}"] if infilter else []
    subprocess.run([soffice, f"-env:UserInstallation=file://{profile}", "--headless", *reading,
                    "--convert-to", to, "--outdir", str(tmp_path), str(source)],
                   check=True, capture_output=True, timeout=180)
    out = tmp_path / (source.stem + "." + to.split(":")[0])
    assert out.exists(), f"LibreOffice wrote no {out.name}"
    return out


def test_seed_template_in_excel_openpyxl_and_libreoffice(cluster, tmp_path):
    import openpyxl

    urls = _pages(cluster, tmp_path)
    got = exports.request(cluster.redis, "dc", "xlsx", json.dumps(REPORT))
    assert run_export(str(got.export.id), "w1") == "success"
    export = Export.objects.get(id=got.export.id)
    assert export.rows_done == 3 + 2 + 4
    data = _file(export.id)
    sheet = openpyxl.load_workbook(io.BytesIO(data))["report"]
    assert {str(r) for r in sheet.merged_cells.ranges} == {
        "A1:G1", "A2:G2", "B3:G3", "B4:G4",                      # title, summary, header pairs
        "A5:B7", "C6:C7", "D5:F5", "D6:D7", "E6:F6", "G5:G7",    # corner and the column tree
        "A8:A12", "B8:B10", "B11:B12",                           # the row tree (row_count 3 and 2)
        "B13:G13", "B14:G14", "A16:B16"}                         # footer pairs, the second table's title
    values = [[c.value for c in row] for row in sheet.iter_rows(max_col=7)]
    assert (
        values[0][0] == "Crawl report"
        and values[2][:2] == ["Job", "dc"]
        and values[3][:2] == ["Site", "sample"]
    )
    assert values[4][2:4] == ["Request", "Response"] and values[4][6] == "Fetched"
    assert values[5][2:5] == ["URL", "Status", "Body"] and values[6][4:6] == ["Bytes", "Charset"]
    assert (
        [values[r][0] for r in (7,)] == ["Answered"] and values[7][1] == "OK" and values[10][1] == "Partial"
    )
    assert [values[r][2] for r in range(7, 12)] == urls[:3] + urls[4:6]  # task order within each row header
    assert [values[r][3] for r in range(7, 12)] == [200, 200, 200, 203, 203]
    assert values[12][:2] == ["Checked by", "ops"] and values[14] == [None] * 7
    assert values[15][0] == "All pages" and values[16][:2] == ["URL", "Bytes"]
    assert [values[r][0] for r in range(17, 21)] == urls[:4]
    assert sheet["E8"].number_format == "#,##0" and sheet["G8"].number_format == "yyyy-mm-dd hh:mm"
    assert isinstance(sheet["G8"].value, datetime) and sheet.row_dimensions[8].height == 18
    assert sheet.page_setup.orientation == "landscape" and sheet.sheet_properties.pageSetUpPr.fitToPage
    assert sheet.page_setup.fitToHeight == 0

    soffice = _soffice()
    source = tmp_path / "report.xlsx"
    source.write_bytes(data)
    rows = list(
        csv.reader(_convert(soffice, source, "csv", tmp_path).read_text(encoding="utf-8").splitlines())
    )
    assert rows[0][0] == "Crawl report" and rows[7][:4] == ["Answered", "OK", urls[0], "200"]
    assert [r[0] for r in rows[17:21]] == urls[:4]
    pdf = _convert(soffice, source, "pdf", tmp_path)
    text = subprocess.run(
        ["pdftotext", "-layout", str(pdf), "-"], capture_output=True, text=True, check=True
    ).stdout
    assert "Crawl report" in text and "All pages" in text and "Page 1 of 1" in text
    assert text.index(urls[0]) < text.index("Partial")  # one page wide: the URL column beside the rest
    VAR.mkdir(exist_ok=True)
    subprocess.run(["pdftoppm", "-png", "-r", "70", "-f", "1", "-l", "1", "-singlefile", str(pdf),
                    str(VAR / "download-center-page1")], check=True, timeout=60)
    assert (VAR / "download-center-page1.png").stat().st_size > 10_000


def test_a_long_single_table_prints_its_headers_on_every_page(cluster, tmp_path):
    import openpyxl

    from tests.helpers import TEMPLATE

    _job_with_pages(cluster, tmp_path, n=3)
    got = exports.request(cluster.redis, "j", "xlsx", TEMPLATE)
    assert run_export(str(got.export.id), "w1") == "success"
    sheet = openpyxl.load_workbook(io.BytesIO(_file(got.export.id)))["pages"]
    assert sheet.print_title_rows == "$1:$2" and sheet.sheet_properties.pageSetUpPr.fitToPage
    assert [sheet.cell(row=r, column=1).value for r in (3, 4, 5)] == [
        f"{cluster.site}/page/{i}" for i in range(3)
    ]


def test_cli_data_export_takes_the_same_formats_and_templates(cluster, tmp_path):
    import openpyxl

    urls = _pages(cluster, tmp_path)
    template = tmp_path / "report.json"
    template.write_text(json.dumps(REPORT))
    out = tmp_path / "report.xlsx"
    result = cli("data", "export", "dc", "--format", "xlsx", "--template", str(template), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert openpyxl.load_workbook(out)["report"]["C8"].value == urls[0]
    result = cli("data", "export", "dc", "--format", "csv", "--status", "203")
    assert result.exit_code == 0 and result.output.count("/status/203") == 2 and "/page/" not in result.output
    bad = cli("data", "export", "dc", "--format", "csv", "--template", str(template))
    assert bad.exit_code != 0 and "need format xlsx" in bad.output


def test_an_export_over_its_time_limit_is_stopped_and_retried_though_it_beats(cluster, tmp_path):
    _job_with_pages(cluster, tmp_path, n=1)
    got = exports.request(cluster.redis, "j", "csv", max_exec_time=10)
    now = utcnow()
    coll = Export._get_collection()
    coll.update_one(
        {"_id": got.export.id},
        {
            "$set": {  # a worker that hangs yet still beats
                "state": "RUNNING",
                "worker": "w-stuck",
                "attempts": 1,
                "beat_at": now,
                "started_at": now - timedelta(seconds=11),
                "deadline_at": now - timedelta(seconds=1),
            }
        },
    )
    assert exports.tend(cluster.redis).overran == 1
    doc = coll.find_one({"_id": got.export.id})
    assert doc["state"] == "PENDING" and "time limit of 10 s" in doc["error"] and doc["worker"] is None
    with pytest.raises(Stopped):  # the hung worker, if it wakes, finds the export no longer its own
        _Progress(got.export.id, "w-stuck").write()
    assert run_export(str(got.export.id), "w2") == "success"
    with pytest.raises(Exception, match="max_exec_time"):
        exports.request(cluster.redis, "j", "csv", max_exec_time=5)


# --- over HTTP -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def webs(redis_server, mongo_server):
    """Two web processes: one with room for small synchronous downloads, one with no slot."""
    env = env_for(
        redis_server.url, mongo_server.uri("dc_test"), mongo_server.uri("dc_test_log"), HOSTNAME="testhost"
    )
    with WebServer(env, EXPORT_SYNC_MAX_ROWS=5) as one, WebServer(env, EXPORT_SYNC_SLOTS=0) as other:
        yield one, other


def test_sync_download_small_at_once_large_or_busy_asynchronous(cluster, tmp_path, webs):
    import openpyxl

    one, busy = webs
    token = new_token("ann", "analyst")
    urls = _pages(cluster, tmp_path)
    small = one.call("GET", "/api/v1/jobs/dc/export?format=csv&status=203", token)
    assert small.status_code == 200 and small.headers["content-type"].startswith("text/csv")
    assert "attachment" in small.headers["content-disposition"] and small.headers["x-export-rows"] == "2"
    assert sorted(r[0] for r in csv.reader(small.text.splitlines()))[:2] == urls[4:]  # store order
    template = json.dumps(
        {"sheet": "partial", "title": "Partial answers", "col": [{"name": "url", "title": "URL"}]}
    )
    book = one.call("POST", "/api/v1/jobs/dc/export", token, json={"format": "xlsx", "template": template,
                                                                   "filter": {"status": [203]}})
    assert book.status_code == 200 and book.headers["content-type"] == XLSX
    sheet = openpyxl.load_workbook(io.BytesIO(book.content))["partial"]
    assert [sheet[c].value for c in ("A1", "A2", "A3", "A4")] == [
        "Partial answers",
        "URL",
        *urls[4:],
    ]  # task order
    large = one.call("GET", "/api/v1/jobs/dc/export?format=jsonl", token)  # 6 rows > EXPORT_SYNC_MAX_ROWS
    assert large.status_code == 202 and "EXPORT_SYNC_MAX_ROWS" in large.json()["reason"]
    assert large.headers["location"] == f"/api/v1/exports/{large.json()['id']}"
    shown = one.call("GET", large.headers["location"], token).json()
    assert shown["state"] == "PENDING" and shown["requested_by"] == "ann"
    full = busy.call("GET", "/api/v1/jobs/dc/export?format=csv&status=203", token)
    assert full.status_code == 202 and "slots" in full.json()["reason"]
    from urllib.parse import quote

    long_template = json.dumps({"summary": "s" * 2000, "col": [{"name": "url", "title": "Address"}]})
    assert 1024 < len(long_template) < 8192
    answer = one.call(
        "GET", f"/api/v1/jobs/dc/export?format=csv&status=203&template={quote(long_template)}", token
    )
    assert (
        answer.status_code == 200 and answer.text.splitlines()[0] == "Address"
    )  # a long template in the URL
    for bad in ("format=pdf", "status=abc", "since=yesterday", "template=%7Bnope"):
        answer = one.call("GET", f"/api/v1/jobs/dc/export?{bad}", token)
        assert answer.status_code == 422 and "\n" not in answer.json()["error"], bad
    assert one.call("GET", "/api/v1/jobs/nope/export", token).status_code == 404
    assert one.call("GET", "/api/v1/jobs/dc/export").status_code == 401


def test_who_may_see_an_export_links_and_the_permanent_route(cluster, tmp_path, webs):
    one, _ = webs
    ann, bob, root = new_token("ann", "analyst"), new_token("bob", "analyst"), new_token("root", "admin")
    _job_with_pages(cluster, tmp_path, n=2)
    made = one.call("POST", "/api/v1/exports", ann, json={"job": "j", "format": "csv"}).json()
    assert run_export(made["id"], "w1") == "success"
    base = f"/api/v1/exports/{made['id']}"
    for path in (base, base + "/file", base + "/link"):
        assert one.call("GET", path, bob).status_code == 404, path
        assert one.call("GET", path, ann).status_code == 200, path
        assert one.call("GET", path, root).status_code == 200, path
    assert [e["id"] for e in one.call("GET", "/api/v1/exports", bob).json()["exports"]] == []
    assert one.call("POST", base + "/cancel", bob).status_code == 404
    assert cli("token", "grant", "bob", "j").exit_code == 0
    assert one.call("GET", base + "/file", bob).status_code == 200
    assert [e["id"] for e in one.call("GET", "/api/v1/exports", bob).json()["exports"]] == [made["id"]]
    assert one.call("POST", base + "/cancel", bob).status_code == 403  # seeing is not owning
    assert cli("token", "grant", "bob", "j", "--remove").exit_code == 0
    assert one.call("GET", base, bob).status_code == 404

    whole = one.call("GET", base + "/file", ann)
    assert whole.content == _file(made["id"]) and whole.headers["content-type"].startswith("text/csv")
    short = one.call("GET", base + "/link?ttl=60", ann).json()
    ends = datetime.fromisoformat(short["expires_at"].rstrip("Z"))
    assert timedelta(seconds=50) < ends - utcnow() <= timedelta(seconds=61)
    assert (
        requests.get(short["url"], timeout=10).content == whole.content
    )  # no token: the link is the credential
    default = one.call("GET", base + "/link", ann).json()
    assert datetime.fromisoformat(default["expires_at"].rstrip("Z")) - utcnow() <= timedelta(seconds=301)
    assert one.call("GET", base + "/link?ttl=99999999", ann).status_code == 422


def test_websocket_tells_running_progress_and_success_from_another_process(
    cluster, tmp_path, webs, monkeypatch
):
    from websockets.exceptions import ConnectionClosed, InvalidHandshake
    from websockets.sync.client import connect

    from slave import exporter

    one, other = webs
    ann, bob = new_token("ann", "analyst"), new_token("bob", "analyst")
    _job_with_pages(cluster, tmp_path, n=3)
    made = other.call("POST", "/api/v1/exports", ann, json={"job": "j", "format": "jsonl"}).json()
    url = one.base.replace("http", "ws") + f"/api/v1/exports/{made['id']}/events"
    with pytest.raises(InvalidHandshake):  # no token: the handshake is refused
        connect(url, open_timeout=10).close()
    with connect(url, additional_headers={"Authorization": f"Bearer {bob}"}, open_timeout=10) as ws:
        assert "error" in json.loads(ws.recv(timeout=10))  # not bob's
    events = []
    with connect(url, additional_headers={"Authorization": f"Bearer {ann}"}, open_timeout=10) as ws:
        events.append(json.loads(ws.recv(timeout=10)))
        assert events[0]["state"] == "PENDING"
        monkeypatch.setattr(exporter, "PROGRESS_ROWS", 1)  # a progress event for every row
        runner = threading.Thread(target=run_export, args=(made["id"], "w1"))
        runner.start()
        try:
            while events[-1]["state"] not in ("SUCCESS", "FAIL"):
                events.append(json.loads(ws.recv(timeout=30)))
        finally:
            runner.join(60)
        with pytest.raises(ConnectionClosed):  # closed by the server after the final state
            ws.recv(timeout=10)
    states = [e["state"] for e in events]
    assert "RUNNING" in states and states[-1] == "SUCCESS"
    progress = [e["rows_done"] for e in events if e["state"] == "RUNNING"]
    assert 0 < max(progress) <= 3 and progress == sorted(progress)
    assert events[-1]["rows_done"] == events[-1]["rows_total"] == 3
    # a final export answers once and closes
    with connect(url, additional_headers={"Authorization": f"Bearer {ann}"}, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["state"] == "SUCCESS"
        started = time.monotonic()
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)
        assert time.monotonic() - started < 30


def test_a_websocket_ends_soon_after_its_token_is_revoked(cluster, tmp_path, webs):
    """Checked while it streams, not only at the handshake: a revoked token hears no more."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    one, _ = webs
    ann = new_token("ann", "analyst")
    _job_with_pages(cluster, tmp_path, n=1)
    made = one.call("POST", "/api/v1/exports", ann, json={"job": "j", "format": "jsonl"}).json()
    url = one.base.replace("http", "ws") + f"/api/v1/exports/{made['id']}/events"
    with connect(url, additional_headers={"Authorization": f"Bearer {ann}"}, open_timeout=10) as ws:
        assert json.loads(ws.recv(timeout=10))["state"] == "PENDING"  # no worker runs it: it stays open
        assert cli("token", "revoke", "ann").exit_code == 0
        assert "revoked" in json.loads(ws.recv(timeout=30))["error"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
