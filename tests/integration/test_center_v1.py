"""Seed 000's callers switch by changing their base URL (issue 50): a caller written from the
public implementation they use today (its signer, its envelope, its status numbers, its routes),
unchanged, against a started ``downcluster web``; a business back end (a real HTTP server here)
that checks the center's signature on every pull and receives the form callback; the files read by
openpyxl; a browser-like WebSocket client from another origin without a token."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, quote_plus, urlsplit

import pytest
import requests

from common.store.control_models import AuditEntry
from common.store.models import Export
from tests.helpers import burst_worker, cli, with_settings
from tests.integration.test_center import FAST
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

CENTER_ID, CENTER_SECRET = "download-center", "center-secret-0001"
APP_ID, APP_SECRET = "mp-backend", "caller-secret-0001"
PROJECT = "bf1fd528-b505-4e7c-9c3b-8a1f5d0c2e77"  # the string id the old center gave the caller


# --- the caller, as linvanda/wecarswoole's WecarSigner and request assembler make its requests ---

def php_build_query(params: dict) -> str:
    """PHP's http_build_query of flat parameters: urlencode (space as '+', '~' encoded)."""
    def enc(v) -> str:
        return quote_plus(str(v), safe="").replace("~", "%7E")
    return "&".join(f"{enc(k)}={enc(v)}" for k, v in params.items())


def wecar_sign(params: dict, secret: str) -> str:
    """WecarSigner::signature: ksort, http_build_query, the secret appended, md5."""
    ordered = {k: params[k] for k in sorted(params)}
    return hashlib.md5((php_build_query(ordered) + secret).encode()).hexdigest()


def signed(params: dict, app_id: str = APP_ID, secret: str = APP_SECRET, wrap: bool = False) -> dict:
    """ApiAuthMiddleware's parameters: flat with app_id and token, or the assembler's data= form."""
    body = {"app_id": app_id, "data": json.dumps(params)} if wrap else {**params, "app_id": app_id}
    return {**body, "token": wecar_sign(body, secret)}


class Caller:
    def __init__(self, base: str) -> None:
        self.base = base

    def post(self, path: str, params: dict, **kw) -> dict:
        r = requests.post(self.base + path, data=signed(params, **kw), timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def get(self, path: str, params: dict, **kw) -> requests.Response:
        r = requests.get(self.base + path, params=signed(params, **kw), timeout=30)
        assert r.status_code == 200, r.text
        return r


# --- the business back end: its paging source checks the center's signature; it takes callbacks ---

class Backend(BaseHTTPRequestHandler):
    pulls: list[dict] = []
    callbacks: list[dict] = []

    def log_message(self, *args) -> None:
        pass

    def _json(self, payload: dict) -> None:
        body = json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        q = dict(parse_qsl(parts.query, keep_blank_values=True))
        Backend.pulls.append({"path": parts.path, **q})
        token = q.pop("token", "")
        if q.get("app_id") != CENTER_ID or wecar_sign(q, CENTER_SECRET) != token:
            return self._json({"status": 300, "msg": "invalid invoke:verify token faild.", "data": []})
        if parts.path == "/redirect":  # to wherever ?to= says (a service of the cluster)
            self.send_response(302)
            self.send_header("Location", q["to"])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        page, size, n = int(q["page"]), int(q["page_size"]), int(q.get("n", 0))
        rows = [{"order_no": f"NO{i}", "amount": i * 10, "station": f"站{i % 3}"}
                for i in range(page * size, min(n, (page + 1) * size))]
        inner: dict = {"data": rows}
        if parts.path == "/total":
            inner["total"] = n
        elif parts.path == "/filtered":  # filters after reading: short pages, force_continue
            inner = {"data": rows[: len(rows) // 2], "force_continue": 1 if rows else 0}
        self._json({"status": 200, "msg": "", "data": inner})

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        form = dict(parse_qsl(body, keep_blank_values=True))
        token = form.pop("token", "")
        form["_ok"] = wecar_sign(form, CENTER_SECRET) == token and form.get("app_id") == CENTER_ID
        form["_type"] = self.headers.get("Content-Type")
        Backend.callbacks.append(form)
        self._json({"status": 200, "msg": ""})


@pytest.fixture(scope="module")
def backend():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def center(cluster, monkeypatch):
    """The cluster as the center: its own app id and secret, callbacks and sources on loopback,
    project 'orders' known to the caller by its old string id, the caller registered."""
    with_settings(cluster, monkeypatch, {**FAST, "DOWNCLUSTER_WEBHOOK_ALLOW_PRIVATE": "1",
                                         "DOWNCLUSTER_CENTER_APP_ID": CENTER_ID,
                                         "DOWNCLUSTER_CENTER_APP_SECRET": CENTER_SECRET})
    assert cli("project", "create", "orders").exit_code == 0
    assert cli("project", "create", "elsewhere").exit_code == 0
    assert cli("caller", "alias", PROJECT, "orders").exit_code == 0
    added = cli("caller", "add", APP_ID, "--project", "orders", "--secret", APP_SECRET)
    assert added.exit_code == 0, added.output
    Backend.pulls.clear()
    Backend.callbacks.clear()
    web = WebServer(cluster.env)
    web.env["DOWNCLUSTER_PUBLIC_URL"] = web.base
    cluster.env["DOWNCLUSTER_PUBLIC_URL"] = web.base
    with web:
        yield cluster, web, Caller(web.base)


def task(backend: str, path: str = "/total", n: int = 250, **extra) -> dict:
    return {"project_id": PROJECT, "name": "订单导出", "merchant_type": 2, "merchant_id": 88,
            "source_url": f"{backend}{path}?n={n}", "step": 100, "operator_id": "u1",
            "template": json.dumps({"order_no": "订单号", "amount": "金额"}), **extra}


def test_a_caller_of_the_seeds_center_switches_by_its_base_url(center, backend):
    cluster, web, caller = center
    made = caller.post("/v1/task", task(backend, callback=f"{backend}/callback"))
    assert made["status"] == 200 and set(made) == {"status", "msg", "info", "data", "retry"}, made
    task_id = made["data"]["task_id"]
    again = caller.post("/v1/task", task(backend, callback=f"{backend}/callback"))  # seeds 001, 004
    assert again["data"]["task_id"] == task_id
    wrapped = caller.post("/v1/task", task(backend, "/nototal", n=230, type="excel"), wrap=True)
    assert wrapped["status"] == 200, wrapped
    filtered = caller.post("/v1/task", task(backend, "/filtered", n=400, step=7))  # step 7: 1000
    shown = caller.get("/v1/task", {"task_id": task_id}).json()["data"]
    assert (shown["status"], shown["status_name"], shown["project_id"]) == (3, "处理中", PROJECT)
    burst_worker(cluster)
    # every pull was signed with the center's own app id (the back end refuses unsigned ones)
    assert Backend.pulls and all(p.get("app_id") == CENTER_ID for p in Backend.pulls)
    assert {p["page_size"] for p in Backend.pulls if p["path"] == "/filtered"} == {"1000"}
    ids = (task_id, wrapped["data"]["task_id"], filtered["data"]["task_id"])
    for made_id, rows in zip(ids, (250, 230, 200)):
        got = caller.get("/v1/task", {"task_id": made_id}).json()["data"]
        assert (got["status"], got["status_name"], got["rows"]) == (4, "处理成功", rows), got
    listing = caller.get("/v1/tasks", {"project_ids": PROJECT, "page": 0, "page_size": 2}).json()["data"]
    assert listing["total"] == 3 and len(listing["data"]) == 2
    assert caller.get("/v1/tasks", {"project_ids": PROJECT, "page": 1, "page_size": 2}).json()["data"][
        "data"][0]["task_id"] == task_id  # newest first, page from 0
    assert caller.get("/v1/tasks", {"project_ids": PROJECT, "page": 0, "status": "3"}).json()["data"][
        "total"] == 0
    # the form callback, signed with the center's secret; its link works without a token
    [hook] = Backend.callbacks
    assert hook["_ok"] and hook["_type"] == "application/x-www-form-urlencoded"
    data = json.loads(hook["data"])
    assert data["task_id"] == task_id and "/v1/download/async?task_id=" in data["download_url"]
    file = requests.get(data["download_url"], timeout=30)
    table = list(csv.reader(io.StringIO(file.content.decode("utf-8-sig"))))
    assert table[0] == ["order_no", "amount", "station"] and len(table) == 251  # CSV header: the rows' keys
    assert caller.get("/v1/download/async", {"task_id": task_id}).content == file.content
    url = caller.get("/v1/download/url", {"task_id": task_id}).json()["data"]["url"]
    assert "/v1/download?ticket=" in url and requests.get(url, timeout=30).content == file.content
    import openpyxl

    book = caller.get("/v1/download/async", {"task_id": wrapped["data"]["task_id"]}).content
    sheet = openpyxl.load_workbook(io.BytesIO(book)).active
    cells = [[c for c in r if c is not None] for r in sheet.iter_rows(values_only=True)]
    assert cells[0] == ["订单号", "金额"] and cells[1] == ["NO0", 0] and len(cells) == 231
    # deleted by its caller; gone for it from then on
    gone = caller.post("/v1/tasks/delete", {"task_ids": task_id, "project_ids": PROJECT})
    assert gone["status"] == 200, gone
    assert caller.get("/v1/task", {"task_id": task_id}).json()["status"] == 507


def test_signatures_projects_and_errors_answer_as_the_seeds_center(center, backend):
    cluster, web, caller = center
    params = task(backend)
    bad = requests.post(web.base + "/v1/task", data={**signed(params), "token": "0" * 32}, timeout=30)
    assert bad.status_code == 200 and bad.json()["status"] == 301
    assert bad.json()["msg"] == "invalid invoke:verify token faild."
    assert requests.post(web.base + "/v1/task", data=params, timeout=30).json()["status"] == 300
    other = requests.post(web.base + "/v1/task", data=signed(params, app_id="nobody"), timeout=30).json()
    assert other["status"] == 300
    changed = {**signed(params), "name": "改过的名字"}  # a parameter changed after signing
    assert requests.post(web.base + "/v1/task", data=changed, timeout=30).json()["status"] == 301
    assert caller.post("/v1/task", {**params, "project_id": "no-such-project"})["status"] == 502
    assert caller.post("/v1/task", {**params, "project_id": "2"})["status"] == 502  # not its project
    assert caller.get("/v1/task", {"task_id": "6" * 40}).json()["status"] == 507
    assert caller.post("/v1/task", {**params, "name": "x"})["status"] == 300
    # the scheme has no time of its own; a caller that signs a timestamp has it checked
    now = int(time.time())
    assert caller.post("/v1/task", {**params, "timestamp": now - 3600})["status"] == 301
    assert caller.post("/v1/task", {**params, "timestamp": now})["status"] == 200
    # a Bearer token keeps working beside signatures
    admin = new_token("root", "admin")
    r = requests.post(web.base + "/v1/task", data=params, headers={"Authorization": f"Bearer {admin}"},
                      timeout=30)
    assert r.json()["status"] == 200, r.text
    # the caller's own projects and groups
    group = caller.post("/v1/group", {"name": "油站"})
    assert group["status"] == 200 and caller.post("/v1/group", {"name": "油站"})["status"] == 505
    project = caller.post("/v1/project", {"name": "储值卡", "group_id": group["data"]["group_id"]})
    assert project["status"] == 200, project
    made = caller.post("/v1/task", {**params, "project_id": project["data"]["project_id"]})
    assert made["status"] == 200, made
    assert caller.post("/v1/project", {"name": "x2", "group_id": "nope"})["status"] == 504
    actions = {e.action for e in AuditEntry.objects}
    assert {"caller.add", "caller.alias", "center.deliver", "center.group", "center.project"} <= actions
    assert not any(APP_SECRET in str(e.to_mongo()) for e in AuditEntry.objects)


def test_the_websocket_answers_another_origin_without_a_token(center, backend):
    from websockets.sync.client import connect

    cluster, web, caller = center
    task_id = caller.post("/v1/task", task(backend, n=5))["data"]["task_id"]
    url = web.base.replace("http", "ws") + "/ws"
    with connect(url, origin="https://shop.example.org", open_timeout=10) as ws:
        ws.send(f"download|{task_id[:24]}")  # the bare ObjectId is not the credential
        assert json.loads(ws.recv(timeout=10))["code"] == 507
        ws.send(f"download|{task_id}")
        runner = threading.Thread(target=burst_worker, args=(cluster,))
        runner.start()
        try:
            answer = json.loads(ws.recv(timeout=60))
        finally:
            runner.join(120)
    assert answer == {"code": 200, "msg": "任务处理成功", "data": {"status": 4}}


def test_deleting_a_task_is_its_requesters_or_an_admins(center, backend):
    """Issue 49 item 2: another user or an analyst of the project gets the answer cancel gives it."""
    cluster, web, _ = center
    from common.store import projects

    project = str(projects.by_name("orders").id)
    owner, peer = new_token("owner", "user", "orders"), new_token("peer", "user", "orders")
    analyst, admin = new_token("ann", "analyst", "orders"), new_token("root", "admin")
    made = requests.post(web.base + "/api/v1/center/tasks", headers={"Authorization": f"Bearer {owner}"},
                         json={"project_id": int(project), "name": "mine", "source_data": [{"a": 1}]},
                         timeout=30).json()
    path = f"/api/v1/center/tasks?task_ids={made['task_id']}&project_ids={project}"
    for who in (peer, analyst):
        r = requests.delete(web.base + path, headers={"Authorization": f"Bearer {who}"}, timeout=30)
        cancel = requests.post(web.base + f"/api/v1/exports/{made['task_id']}/cancel",
                               headers={"Authorization": f"Bearer {who}"}, timeout=30)
        assert r.status_code == cancel.status_code == 403, r.text
    assert Export.objects(id=made["task_id"]).count() == 1
    r = requests.delete(web.base + path, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    assert r.json()["deleted"] == [made["task_id"]]
    actions = {e.action for e in AuditEntry.objects(target=made["task_id"])}
    assert actions == {"center.deliver", "center.delete"}


def test_a_failed_source_runs_again_on_the_seeds_schedule(cluster, monkeypatch, backend):
    """Seed 000's center: a task whose source failed is run again a minute later, 3 runs in all
    (CENTER_TASK_RETRIES, CENTER_RETRY_AFTER); meanwhile callers see it 处理中 (3)."""
    from datetime import timedelta

    from common.store.clock import store_now
    from master.center import service as center_module
    from master.center import v1 as center_v1
    from slave.exporter import run_export

    with_settings(cluster, monkeypatch, {**FAST, "DOWNCLUSTER_CENTER_TASK_RETRIES": "3"})
    assert cli("project", "create", "orders").exit_code == 0
    unsigned = {"project_id": "1", "name": "never signed", "source_url": f"{backend}/total?n=5"}
    given, extra = center_v1.params_of(unsigned)  # no CENTER_APP_ID: the back end refuses the pulls
    export = center_module.deliver(cluster.redis, given, None, extra)
    for attempt in (1, 2):
        assert run_export(str(export.id), "w1") == "retry"
        done = Export.objects.get(id=export.id)
        assert done.state == "PENDING" and done.attempts == attempt
        assert done.retry_at - store_now() > timedelta(seconds=30)  # CENTER_RETRY_AFTER: 60 s
        record = center_module.get(str(export.id))
        shown = center_v1.describe(record)
        assert (shown["status"], shown["status_name"]) == (3, "处理中")
    assert run_export(str(export.id), "w1") == "failed"
    assert center_v1.describe(center_module.get(str(export.id)))["status"] == 6


def test_ended_tasks_are_archived_then_removed(cluster, monkeypatch, tmp_path):
    from datetime import timedelta

    from common.store.clock import store_now
    from master.center import service as center_module
    from master.exports import service
    from master.ops import retention

    with_settings(cluster, monkeypatch, {"DOWNCLUSTER_CENTER_ARCHIVE_DIR": str(tmp_path / "archive")})
    assert cli("project", "create", "orders").exit_code == 0
    rows = json.dumps([{"secret_row": "x" * 100}] * 3)
    old, recent = (center_module.deliver(cluster.redis, {"project_id": 1, "name": f"t{i}",
                                                         "source_data": rows}) for i in range(2))
    for export in (old, recent):
        service.cancel(cluster.redis, str(export.id))
    Export.objects(id=old.id).update_one(set__finished_at=store_now() - timedelta(days=31))
    assert retention.enforce().center_tasks == 1
    assert Export.objects(id=old.id).count() == 0 and Export.objects(id=recent.id).count() == 1
    [archive] = (tmp_path / "archive").iterdir()
    [line] = archive.read_text().splitlines()
    kept = json.loads(line)
    assert kept["_id"] == str(old.id) and kept["center"]["source_data"] == rows


STYLED = [
    {"title": "订单", "children": [
        {"name": "order_no", "title": "订单号", "width": -1, "align": "center", "bold": 1, "color": "red",
         "bg_color": "#FFEEDD", "type": "string", "height": 30},
        {"name": "amount", "title": "金额", "style": {"width": 20, "align": "right"}}]},
    {"name": "station", "title": "油站"}]


def _styles(book_path):
    """What a reader finds in the file: widths, alignments, fonts, fills, where the data starts."""
    import openpyxl

    sheet = openpyxl.load_workbook(book_path).active
    first = next(r for r in range(1, 20) if sheet.cell(r, 1).value == "订单号")
    data = sheet.cell(first + 1, 1)
    return {"header_row": sheet.cell(first - 1, 1).value, "first": first, "value": data.value,
            "order_no": (data.alignment.horizontal, data.font.b, data.font.color.rgb[-6:],
                         data.fill.fgColor.rgb[-6:]),
            "amount": sheet.cell(first + 1, 2).alignment.horizontal,
            "station": sheet.cell(first + 1, 3).alignment.horizontal,
            "pair": sheet.cell(first - 2, 2).alignment.horizontal,
            "widths": (sheet.column_dimensions["A"].width, sheet.column_dimensions["B"].width),
            "head_bold": sheet.cell(first - 1, 1).font.b,
            "row_height": sheet.row_dimensions[first + 1].height}


def test_the_callers_template_styles_and_offsets_in_the_xlsx(center, backend, tmp_path):
    """Seed 000's leaf style keys (flat and in style{}), width -1 (automatic) and widths in Excel's
    characters, col_align, header_align, rowoffset and default_height, as openpyxl reads the file
    and as LibreOffice reads it (its own re-save of the file, read again)."""
    from tests.integration.test_download_center import _convert, _soffice

    cluster, web, caller = center
    made = caller.post("/v1/task", task(backend, n=40, type="excel", template=json.dumps(STYLED),
                                        col_align="left", header=json.dumps({"油站": "钓鱼岛"}),
                                        header_align="right", rowoffset=2, default_height=30,
                                        default_width=12))
    assert made["status"] == 200, made
    burst_worker(cluster)
    book = tmp_path / "styled.xlsx"
    book.write_bytes(caller.get("/v1/download/async", {"task_id": made["data"]["task_id"]}).content)
    want = {"header_row": "订单", "first": 5, "value": "NO0",
            "order_no": ("center", True, "FF0000", "FFEEDD"),
            "amount": "right", "station": "left", "pair": "right", "head_bold": True, "row_height": 30}
    got = _styles(book)
    assert {k: got[k] for k in want} == want, got
    auto, amount = got["widths"]
    assert amount == pytest.approx(20, abs=0.2) and 7 <= auto <= 12, got["widths"]  # "NO39" + margin
    soffice = _soffice()
    again = _convert(soffice, book, "xlsx:Calc MS Excel 2007 XML", tmp_path / "lo")
    seen = _styles(again)
    assert {k: seen[k] for k in ("first", "value", "order_no", "amount", "station", "pair")} == {
        k: want[k] for k in ("first", "value", "order_no", "amount", "station", "pair")}, seen
    assert seen["widths"][1] == pytest.approx(20, abs=0.6)


def test_a_pull_never_follows_a_redirect(center, backend):
    """A source answering 302 towards a service of the cluster: the pull stops there (no request
    reaches the Location) and the task fails with that one line."""
    cluster, web, caller = center
    redis_port = cluster.redis_server.port
    target = f"http://127.0.0.1:{redis_port}/"
    made = caller.post("/v1/task", task(backend) | {
        "source_url": f"{backend}/redirect?to={target}"})
    burst_worker(cluster)
    got = caller.get("/v1/task", {"task_id": made["data"]["task_id"]}).json()["data"]
    assert got["status"] == 6 and got["failed_reason"].endswith("answered HTTP 302"), got
