"""The general download center (seed 000): download tasks whose rows come from the caller's own
``source_url`` (a real paging HTTP server started here) or ``source_data``, through the seed's
interface (/v1, form and JSON), the worker's export protocol and the export writers; every bad
input of issue 39 gets its one line, and nothing half-made is published."""
from __future__ import annotations

import csv
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from common.errors import ValidationError
from common.store.models import Export
from master.center import params as center_params
from master.center import service as center
from slave.exporter import run_export
from tests.helpers import burst_worker, cli, with_settings
from tests.integration.test_exports import _file
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

FAST = {"DOWNCLUSTER_SOURCE_ALLOW_PRIVATE": "1", "DOWNCLUSTER_SOURCE_RETRIES": "2",
        "DOWNCLUSTER_SOURCE_RETRY_DELAY": "0.05", "DOWNCLUSTER_SOURCE_TIMEOUT": "1.5",
        "DOWNCLUSTER_CENTER_TASK_RETRIES": "1"}
OTHER = {"title": "Other", "children": [{"title": "Age", "name": "age"}, {"title": "City", "name": "city"}]}
TEMPLATE = [{"title": "Person", "children": [{"title": "Name", "name": "name"}, OTHER]}]


def row(i: int) -> dict:
    return {"name": f"姓名{i}", "age": 20 + i % 50, "city": f"city {i}", "_row_head_": "front_end"}


class Source(BaseHTTPRequestHandler):
    """A caller's paging source: /rows?n=N (the seed's answer), and sources that misbehave."""
    seen: list[dict] = []
    flaky: dict[str, int] = {}

    def log_message(self, *args) -> None:
        pass

    def _answer(self, payload, status: int = 200, kind: str = "application/json") -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the puller gave up on a page that hung
            pass

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        parts = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(parts.query).items()}
        Source.seen.append({"path": parts.path, "host": self.headers.get("Host"), **q})
        page, size = int(q.get("page", 0)), int(q.get("page_size", 1000))
        n = int(q.get("n", 0))
        kind = parts.path
        if kind == "/flaky" and Source.flaky.setdefault(q.get("_task_id", ""), 0) < 1:
            Source.flaky[q.get("_task_id", "")] += 1
            return self._answer(b"busy", 503, "text/plain")
        if kind == "/html":
            return self._answer(b"<html><body>login</body></html>", 200, "text/html")
        if kind == "/shape":
            return self._answer({"status": 200, "msg": "", "data": {"rows": [row(1)], "count": 1}})
        if kind == "/error":
            return self._answer(b"oops", 500, "text/plain")
        if kind == "/trickle":  # headers at once, then a byte every 0.4 s: each read is quick
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.4)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return None
        if kind == "/hang":
            time.sleep(3)
            return self._answer({"status": 200, "data": {"data": [], "total": 0}})
        if kind == "/chunked":  # the seed's answer, sent in chunks (no Content-Length)
            rows = [row(i) for i in range(page * size, min(n, (page + 1) * size))]
            body = json.dumps({"status": 200, "msg": "", "data": {"data": rows, "total": n}}).encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
            for at in range(0, len(body), 1000):
                part = body[at:at + 1000]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True
            return None
        total = n
        if kind == "/more":       # says n, gives full pages for ever
            rows = [row(page * size + i) for i in range(size)]
        elif kind == "/fewer":    # says n, ends after one page
            rows = [row(i) for i in range(min(size, n))] if page == 0 else []
        elif kind == "/endless":  # says a total past SOURCE_MAX_ROWS
            total, rows = 10**12, [row(page * size + i) for i in range(size)]
        else:                     # /rows, /flaky, /styled: the seed's source
            rows = [row(i) for i in range(page * size, min(n, (page + 1) * size))]
        inner: dict = {"data": rows, "total": total}
        if kind == "/styled" and page == 0:
            inner |= {"template": TEMPLATE, "header": {"油站": "钓鱼岛", "日期": "2020-07-24"},
                      "footer": {"负责人": "linvanda", "签名": "        "}}
        self._answer({"status": 200, "msg": "", "data": inner})


@pytest.fixture(scope="module")
def source():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Source)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def projects_one_to_nine(cluster):
    """Projects 1..9 (the tasks here name 7, 8 and 9; a token holds the ones it names)."""
    from common.store import projects

    n = 0
    while projects.by_id(9) is None:
        n += 1
        projects.add(f"team-{n}")


@pytest.fixture
def fast(cluster, monkeypatch):
    return with_settings(cluster, monkeypatch, FAST)


def task(**params) -> dict:
    return {"project_id": 7, "name": "orders", **params}


def _cells(done: Export) -> list[list]:
    import openpyxl

    sheet = openpyxl.load_workbook(io.BytesIO(_file(done.id))).active
    return [[c for c in r if c is not None] for r in sheet.iter_rows(values_only=True)]


def run(export) -> Export:
    run_export(str(export.id), "w1")
    return Export.objects.get(id=export.id)


def test_source_url_pulled_page_by_page_into_csv(fast, source):
    Source.seen.clear()
    export = center.deliver(fast.redis, task(source_url=f"{source}/rows?n=2345", step=1000, operator_id="op1",
                                             merchant_type=1, merchant_id=9))
    done = run(export)
    assert done.state == "SUCCESS" and done.rows_done == 2345, done.error
    pages = [s for s in Source.seen if s["path"] == "/rows"]
    assert [(p["page"], p["page_size"], p["_task_id"]) for p in pages] == [
        (str(i), "1000", str(export.id)) for i in range(3)]  # stopped at total: no fourth page
    table = list(csv.reader(io.StringIO(_file(done.id).decode())))
    assert table[0] == ["name", "age", "city", "_row_head_"][:3]  # the first row's keys (but _row_head_)
    assert table[1] == ["姓名0", "20", "city 0"] and len(table) == 2346
    got = center.describe(center.get(done.id))
    assert got["status"] == 3 and got["status_text"] == "done" and got["type"] == "csv"
    assert got["operator_id"] == "op1" and got["merchant_type"] == 1 and got["project_id"] == 7


def test_the_answers_template_header_and_footer_override_the_tasks(fast, source):
    import openpyxl

    export = center.deliver(fast.redis, task(
        source_url=f"{source}/styled?n=250", step=100, type="excel", title="订单", summary="all orders",
        header=json.dumps({"from": "task"}), template=json.dumps({"name": "Name only"}), default_width=30))
    done = run(export)
    assert done.state == "SUCCESS" and done.rows_done == 250, done.error
    sheet = openpyxl.load_workbook(io.BytesIO(_file(done.id))).active
    cells = [[c for c in r if c is not None] for r in sheet.iter_rows(values_only=True)]
    cells = [r for r in cells if r]
    assert cells[0] == ["订单"] and cells[1] == ["all orders"]
    assert ["油站", "钓鱼岛"] in cells and ["from", "task"] not in cells  # the answer's header won
    assert ["Person"] in cells and ["Name", "Other"] in cells and ["Age", "City"] in cells
    assert ["姓名249", 20 + 249 % 50, "city 249"] in cells
    assert cells[-1] == ["签名", "        "] or ["负责人", "linvanda"] in cells


def test_source_data_one_table_and_multi_table(fast):

    rows = [{"name": "张三", "age": 12}, {"name": "李四", "age": 13}]
    done = run(center.deliver(fast.redis, task(source_data=json.dumps(rows), template='{"name": "姓名"}')))
    assert done.state == "SUCCESS" and _file(done.id).decode().splitlines() == ["姓名", "张三", "李四"]
    # multi-table mode: source_data, template, title, header as lists, one per table (excel only)
    multi = task(type="excel", source_data=json.dumps([rows, [{"city": "x"}]]),
                 template=json.dumps([{"name": "姓名", "age": "年龄"}, {"city": "城市"}]),
                 title=json.dumps(["表格标题1", "表格标题2"]),
                 footer=json.dumps([{"签名": "a"}, {"签名": "b"}]))
    done = run(center.deliver(fast.redis, multi))
    assert done.state == "SUCCESS" and done.rows_done == 3, done.error
    cells = _cells(done)
    assert ["表格标题1"] in cells and ["表格标题2"] in cells and ["城市"] in cells and ["x"] in cells
    with pytest.raises(ValidationError, match="excel"):
        center_params.check(task(source_data=json.dumps([rows, rows])))
    # row headers: rows keyed by their row leaf (the seed's three-dimensional form)
    keyed = {"front_end": [{"name": "a"}, {"name": "b"}], "back_end": [{"name": "c"}]}
    tpl = {"col": [{"title": "Name", "name": "name"}],
           "row": [{"title": "云研发", "children": [{"name": "front_end", "title": "前端", "row_count": 2},
                                                  {"name": "back_end", "title": "后端", "row_count": 1}]}]}
    done = run(center.deliver(fast.redis, task(type="excel", source_data=json.dumps(keyed),
                                               template=json.dumps(tpl))))
    cells = _cells(done)
    assert ["云研发", "前端", "a"] in cells and ["后端", "c"] in cells


def test_a_chunked_source_is_read_whole(fast, source):
    done = run(center.deliver(fast.redis, task(source_url=f"{source}/chunked?n=350", step=100)))
    assert done.state == "SUCCESS" and done.rows_done == 350, done.error


def test_a_source_that_fails_once_is_retried(fast, source):
    done = run(center.deliver(fast.redis, task(source_url=f"{source}/flaky?n=150", step=100)))
    assert done.state == "SUCCESS" and done.rows_done == 150


@pytest.mark.parametrize("path, reason", [
    ("/html?n=1", "not JSON (begins '<html>"),
    ("/shape?n=1", "no data.data list"),
    ("/error?n=1", "HTTP 500"),
    ("/more?n=150", "more rows than its total of 150"),
    ("/fewer?n=500", "ended after 100 rows of the 500"),
    ("/hang?n=1", "no answer (ReadTimeoutError)"),
    ("/trickle?n=1", "took longer than SOURCE_TIMEOUT (1.5 s)"),
    ("/endless?n=1", "over SOURCE_MAX_ROWS"),
])
def test_a_source_that_breaks_its_word_fails_the_task_in_one_line(fast, source, path, reason):
    export = center.deliver(fast.redis, task(source_url=f"{source}{path}", step=100, type="excel"))
    assert run_export(str(export.id), "w1") == "failed"
    done = Export.objects.get(id=export.id)
    assert done.state == "FAIL" and reason in done.error and "\n" not in done.error, done.error
    db = Export._get_collection().database
    assert db["export_fs.files"].count_documents({}) == 0 and db["export_fs.chunks"].count_documents({}) == 0
    assert center.describe(center.get(done.id))["status"] == 4


@pytest.mark.parametrize("params, reason", [
    (task(source_url="ftp://example.org/x"), "source_url must be http(s)"),
    (task(source_url="http://10.1.2.3/rows"), "10.1.2.3 is not a public address"),
    (task(source_url="http://127.0.0.1:9/rows"), "127.0.0.1 is not a public address"),
    (task(source_url="http://169.254.169.254/latest"), "169.254.169.254 is not a public address"),
    (task(source_url="http://user@example.org/x"), "without user info"),
    (task(step=99, source_data="[]"), "step must be a whole number from 100 to 5000"),
    (task(step=5001, source_data="[]"), "step must be"),
    (task(name="x", source_data="[]"), "name must be 2 to 60"),
    (task(name="x" * 61, source_data="[]"), "name must be 2 to 60"),
    ({"name": "orders", "source_data": "[]"}, "project_id is required"),
    (task(project_id="seven", source_data="[]"), "project_id must be a whole number"),
    (task(merchant_type=4, source_data="[]"), "merchant_type"),
    (task(type="pdf", source_data="[]"), "type must be csv or excel"),
    (task(), "give source_url or source_data"),
    (task(source_data="[1, 2]"), "source_data must be a list of row objects"),
    (task(source_data="[{"), "source_data is not valid JSON"),
    (task(source_data="[]", template='{"col": [{"title": "x"}]}'), "needs name"),
    (task(source_data="[]", template=json.dumps({"col": [{"name": "a"}], "row": [{"name": "r"}]})),
     "need format xlsx"),
    (task(source_data="[]", file_name="../etc/passwd"), "file_name"),
    (task(source_data="[]", bogus=1), "unknown parameter 'bogus'"),
])
def test_bad_input_is_refused_at_delivery_with_one_line(cluster, params, reason):
    with pytest.raises(ValidationError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        center_params.check(params)
    assert Export.objects.count() == 0


def test_private_sources_only_where_allowed_and_never_the_clusters_services(cluster, monkeypatch, source):
    with pytest.raises(ValidationError, match="is not a public address .*an administrator opened"):
        center_params.check(task(source_url=f"{source}/rows?n=1"))
    with_settings(cluster, monkeypatch, FAST)
    center_params.check(task(source_url=f"{source}/rows?n=1"))
    redis_port = cluster.redis.connection_pool.connection_kwargs["port"]
    with pytest.raises(ValidationError, match="127.0.0.1 is not a public address"):
        center_params.check(task(source_url=f"http://127.0.0.1:{redis_port}/"))


def _v1(web, method: str, path: str, token: str | None, **kw) -> dict:
    """A /v1 call with a Bearer token: always HTTP 200, the outcome in the envelope's status."""
    r = web.call(method, path, token, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_seeds_interface_over_http(fast, source, redis_server, mongo_server, tmp_path):
    """The seed's calls as its document gives them, with Bearer tokens beside the callers'
    signatures (tests/integration/test_center_v1.py): POST /v1/task (form and JSON), the task,
    the list by project_ids with filters and paging from 0, GET /v1/download/sync, delete; a
    real worker."""
    token = new_token("sys", "user", "7", "8", "9")
    other = new_token("eve", "analyst", "9")  # a system of project 9 alone
    with WebServer(fast.env) as web:
        form = {"project_id": "7", "name": "订单导出", "type": "csv", "step": "100", "operator_id": "u1",
                "merchant_type": "2", "merchant_id": "88", "source_url": f"{source}/rows?n=321",
                "file_name": "订单"}
        r = _v1(web, "POST", "/v1/task", token, data=form)
        assert r["status"] == 200, r
        task_id = r["data"]["task_id"]
        r = _v1(web, "POST", "/v1/task", token, json={"project_id": 8, "name": "json task", "type": "excel",
                                                      "source_data": [{"a": 1}], "template": {"a": "A"}})
        assert r["status"] == 200, r
        fewer = {**form, "source_url": f"{source}/fewer?n=500"}
        bad = _v1(web, "POST", "/v1/task", token, data=fewer)["data"]
        burst_worker(fast)  # a real worker: the bad source fails its task, the worker goes on and ends well
        failed = _v1(web, "GET", f"/v1/task?task_id={bad['task_id']}", token)["data"]
        assert (failed["status"], failed["status_name"]) == (6, "处理失败"), failed
        assert failed["failed_reason"] == ("SourceFailed: the source ended after 100 rows of the 500 its "
                                           "total promised (page 1 was empty)")
        got = _v1(web, "GET", f"/v1/task?task_id={task_id}", token)["data"]
        assert got["status"] == 4 and got["rows"] == 321 and got["file_name"] == "订单", got
        assert _v1(web, "GET", f"/v1/task?task_id={task_id}", other)["status"] == 507  # not its task
        assert _v1(web, "GET", f"/v1/task?task_id={r['data']['task_id']}", token)["data"]["status"] == 4
        file = web.call("GET", f"/v1/download/async?task_id={task_id}", token)
        assert file.status_code == 200 and len(file.text.splitlines()) == 322
        assert "filename*=UTF-8''%E8%AE%A2%E5%8D%95.csv" in file.headers["content-disposition"]
        url = _v1(web, "GET", f"/v1/download/url?task_id={task_id}", token)["data"]["url"]
        assert requests.get(url, timeout=30).content == file.content
        assert _v1(web, "GET", f"/v1/download/url?task_id={task_id}", other)["status"] == 507
        listing = _v1(web, "GET", "/v1/tasks?project_ids=7,8&page=1&page_size=2", token)["data"]
        assert listing["total"] == 3 and len(listing["data"]) == 1  # (the two-table task comes later)
        named = _v1(web, "GET", "/v1/tasks?project_ids=7,8&merchant_type=2&task_name=订单&page=0", token)
        assert [t["task_id"] for t in named["data"]["data"]] == [bad["task_id"], task_id]  # newest first
        failed_ones = _v1(web, "GET", "/v1/tasks?project_ids=7&status=6&page=0", token)["data"]["data"]
        assert [t["task_id"] for t in failed_ones] == [bad["task_id"]]
        # a project the token does not hold does not exist for it; its own project's tasks it sees
        assert _v1(web, "GET", "/v1/tasks?project_ids=7,8&page=0", other)["status"] == 502
        assert _v1(web, "GET", "/v1/tasks?project_ids=9&page=0", other)["status"] == 200
        # the synchronous download: the same parameters, small data, the file itself
        small = {**form, "source_url": f"{source}/rows?n=42"}
        sync = web.call("GET", "/v1/download/sync", token, params=small)
        assert sync.status_code == 200 and sync.headers["x-export-rows"] == "42", sync.text
        assert sync.text.splitlines()[:2] == ["name,age,city", "姓名0,20,city 0"]  # the rows' keys
        sync = web.call("POST", "/v1/download/sync", token, json={"project_id": 7, "name": "xlsx now",
                                                                  "type": "excel", "source_data": [{"a": 1}]})
        assert sync.status_code == 200 and sync.content[:2] == b"PK"
        tables = {"project_id": "7", "name": "two tables",
                  "source_data": json.dumps([[{"a": 1}], [{"b": 2}]]),
                  "template": json.dumps([{"a": "A"}, {"b": "B"}]), "title": json.dumps(["one", "two"])}
        assert _v1(web, "POST", "/v1/task/multiple", token, data=tables)["status"] == 200
        sync = web.call("POST", "/v1/download/sync/multiple", token, data=tables)
        assert sync.status_code == 200 and sync.content[:2] == b"PK", sync.text
        bad = _v1(web, "GET", "/v1/download/sync", token, params={**form, "source_url": f"{source}/html?n=1"})
        assert bad["status"] == 510 and "not JSON" in bad["msg"]
        # bad input: status 300 at delivery, one line; the web stays up
        redis_port = fast.redis.connection_pool.connection_kwargs["port"]
        for params, line in [({**form, "name": "x"}, "name"),
                             ({**form, "source_url": "file:///etc/passwd"}, "source_url"),
                             ({**form, "source_url": f"http://127.0.0.1:{redis_port}/"},
                              "not a public address")]:
            r = _v1(web, "POST", "/v1/task", token, data=params)
            assert r["status"] == 300 and line in r["msg"], r
        assert _v1(web, "POST", "/v1/task", None, data=form)["status"] == 300
        # the same actions, typed, in the /api/v1 description
        made = web.call("POST", "/api/v1/center/tasks", token, json={
            "project_id": 9, "name": "typed", "source_data": [{"k": "v"}], "header": {"a": "b"}})
        assert made.status_code == 201 and made.json()["project_id"] == 9, made.text
        assert web.call("GET", f"/api/v1/center/tasks/{made.json()['task_id']}", token).json()["status"] == 1
        assert web.call("GET", "/api/v1/center/tasks?project_ids=9", token).json()["total"] == 1
        assert web.call("POST", "/api/v1/center/tasks", token, json={
            "project_id": 9, "name": "typed", "step": 50, "source_data": []}).status_code == 422
        typed_id = made.json()["task_id"]
        assert web.call("DELETE", f"/api/v1/center/tasks?task_ids={typed_id}&project_ids=9",
                        token).json()["deleted"] == [typed_id]
        paths = web.call("GET", "/api/v1/openapi.json").json()["paths"]
        assert "/api/v1/center/tasks" in paths and not any(p.startswith("/v1/") for p in paths)
        gone = _v1(web, "POST", "/v1/tasks/delete", token, data={"task_ids": f"{task_id},{'0' * 24}",
                                                                 "project_ids": "7"})
        assert gone["status"] == 200
        assert _v1(web, "GET", f"/v1/task?task_id={task_id}", token)["status"] == 507
        assert _v1(web, "GET", f"/v1/download/async?task_id={task_id}", token)["status"] == 507
        assert requests.get(url, timeout=30).json()["status"] == 507


def test_the_command_line_says_what_the_api_says(fast, source, tmp_path):
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]))
    got = cli("center", "request", "--project-id", "3", "--name", "cli task", "--source-data", f"@{rows}",
              "--template", '{"b": "B"}')
    assert got.exit_code == 0, got.output
    task_id = got.stdout.strip().splitlines()[-1]
    assert run_export(task_id, "w1") == "success"
    assert _file(Export.objects.get(id=task_id).id) == b"B\r\nx\r\ny\r\n"
    shown = json.loads(cli("center", "show", task_id).stdout)
    assert shown["status"] == 3 and shown["rows"] == 2 and shown["project_id"] == 3
    got = cli("center", "request", "--project-id", "3", "--name", "cli task", "--source-url",
              f"{source}/rows?n=5", "--step", "99")
    assert got.exit_code == 2 and got.stderr.strip() == "error: step must be a whole number from 100 to 5000"
    assert task_id in cli("center", "list", "--project-ids", "3").stdout
    assert "deleted 1" in cli("center", "delete", "--project-ids", "3", task_id).stdout


def test_the_callback_hears_of_the_task_by_its_id_and_project(cluster, monkeypatch, source):
    from tests.receivers import WebhookReceiver

    with_settings(cluster, monkeypatch, {**FAST, "DOWNCLUSTER_WEBHOOK_ALLOW_PRIVATE": "1"})
    with WebhookReceiver() as hook:
        export = center.deliver(cluster.redis, task(source_url=f"{source}/rows?n=10", step=100,
                                                    callback=hook.url))
        assert run(export).state == "SUCCESS"
        failed = center.deliver(cluster.redis, task(source_url=f"{source}/html?n=1", step=100,
                                                     callback=hook.url))
        assert run(failed).state == "FAIL"
        payloads = [json.loads(body) for _, body in hook.received]
    assert [(p["event"], p["task_id"], p["project_id"], p["name"]) for p in payloads] == [
        ("export.succeeded", str(export.id), 7, "orders"), ("export.failed", str(failed.id), 7, "orders")]
    assert payloads[0]["rows"] == 10 and payloads[0]["url"].startswith("http")


def test_a_listing_does_not_read_the_rows_a_task_carries(cluster):
    from common.store import center as store

    export = center.deliver(cluster.redis, task(source_data=json.dumps([{"a": "x" * 1000}] * 100)))
    tasks, total = store.page(store.Wanted([7]), 0, 10)
    assert total == 1 and tasks[0].id == export.id and tasks[0].center.source_data is None
    assert tasks[0].center.name == "orders" and center.describe(tasks[0])["source"] == "source_data"


def test_a_seed_template_over_a_callers_rows_opens_in_libreoffice(fast, source, tmp_path):
    """The seed's complex column header (人员 > 姓名, 其它 > 年龄, 性别) and row header (云研发 >
    前端, 后端) over a caller's rows, as LibreOffice reads the file."""
    from tests.integration.test_download_center import _convert, _soffice

    soffice = _soffice()
    template = {"col": [{"title": "人员", "children": [
        {"title": "姓名", "name": "name"},
        {"title": "其它", "children": [{"title": "年龄", "name": "age"},
                                       {"title": "性别", "name": "sex"}]}]}],
        "row": [{"title": "云研发", "children": [{"title": "前端", "name": "front_end", "row_count": 2},
                                              {"title": "后端", "name": "back_end", "row_count": 1}]}]}
    rows = [{"name": "张三", "age": 12, "sex": "男", "_row_head_": "front_end"},
            {"name": "李四", "age": 30, "sex": "女", "_row_head_": "back_end"},
            {"name": "王五", "age": 40, "sex": "男", "_row_head_": "front_end"}]
    done = run(center.deliver(fast.redis, task(type="excel", source_data=json.dumps(rows),
                                               template=json.dumps(template), title="表格标题",
                                               header=json.dumps({"油站": "钓鱼岛"}))))
    assert done.state == "SUCCESS", done.error
    book = tmp_path / "seed.xlsx"
    book.write_bytes(_file(done.id))
    table = [[c for c in r if c] for r in csv.reader(
        _convert(soffice, book, "csv:Text - txt - csv (StarCalc):44,34,76", tmp_path)  # 76: UTF-8
        .read_text(encoding="utf-8").splitlines())]
    table = [r for r in table if r]
    assert table[:3] == [["表格标题"], ["油站", "钓鱼岛"], ["人员"]]
    assert ["姓名", "其它"] in table and ["年龄", "性别"] in table
    assert ["云研发", "前端", "张三", "12", "男"] in table and ["王五", "40", "男"] in table
    assert ["后端", "李四", "30", "女"] in table


def test_the_pull_goes_to_the_address_judged_when_it_starts(fast, monkeypatch, source):
    """Judged at delivery and again when the worker starts the pull: by name (the Host header kept),
    in the odd forms of an address, and a source that has become a service of the cluster since
    its delivery is refused before any request reaches it."""
    port = int(source.rsplit(":", 1)[1])
    for url in (f"http://[::ffff:127.0.0.1]:{port}/rows", f"http://2130706433:{port}/rows",
                f"http://localhost:{port}/rows"):
        monkeypatch.setenv("DOWNCLUSTER_SOURCE_ALLOW_PRIVATE", "0")
        from common.config import load

        load()
        with pytest.raises(ValidationError, match="is not a public address") as refused:
            center_params.check(task(source_url=url))
        assert "127.0.0.1" not in str(refused.value) or "localhost" not in url  # a name's address untold
    with_settings(fast, monkeypatch, FAST)
    Source.seen.clear()
    export = center.deliver(fast.redis, task(source_url=f"http://localhost:{port}/rows?n=3", step=100))
    assert run(export).state == "SUCCESS" and Source.seen[-1]["host"] == f"localhost:{port}"
    later = center.deliver(fast.redis, task(source_url=f"{source}/rows?n=3", step=100))
    with_settings(fast, monkeypatch, {"DOWNCLUSTER_WEB_BIND": f"127.0.0.1:{port}"})  # now the cluster's web
    Source.seen.clear()
    done = run(later)
    assert done.state == "FAIL" and "source_url: 127.0.0.1 is not a public address" in done.error
    assert Source.seen == []


def test_a_task_that_ended_without_a_file_expires_after_seven_days(fast, source):
    """The seed's tasks expire after 7 days whatever became of them: a cancelled one too (a done
    one's file expires by EXPORT_TTL as every export's does)."""
    from datetime import timedelta

    from common.store.clock import store_now
    from master.exports import service

    old, recent = (center.deliver(fast.redis, task(source_data="[]")) for _ in range(2))
    for export in (old, recent):
        service.cancel(fast.redis, str(export.id))
    Export.objects(id=old.id).update_one(set__finished_at=store_now() - timedelta(days=8))
    assert service.tend(fast.redis).expired == 1
    assert Export.objects.get(id=old.id).state == "EXPIRED"
    assert center.describe(center.get(old.id))["status"] == 6
    assert Export.objects.get(id=recent.id).state == "CANCEL"


def test_every_center_route_answers_404_across_projects(fast, source):
    """Three projects, a user and an analyst token of each: a task of one project exists for no
    token of another, on every route of the seed's interface (its "no such task" 507 and "no such
    project" 502) and of /api/v1/center (404); a token names only project ids it holds."""
    tokens = {(p, role): new_token(f"{role}{p}", role, str(p))
              for p in (7, 8, 9) for role in ("user", "analyst")}
    with WebServer(fast.env) as web:
        made = {}
        for p in (7, 8, 9):
            body = task(project_id=p, source_data=[{"a": p}])
            r = _v1(web, "POST", "/v1/task", tokens[(p, "user")], json=body)
            assert r["status"] == 200, r
            made[p] = r["data"]["task_id"]
        burst_worker(fast)
        for (p, role), token in tokens.items():
            mine, theirs = made[p], [made[q] for q in (7, 8, 9) if q != p]
            assert _v1(web, "GET", f"/v1/task?task_id={mine}", token)["data"]["status"] == 4
            # the task's own doors too, for every token of its project (not only its requester)
            assert web.call("GET", f"/api/v1/exports/{mine[:24]}/file", token).status_code == 200
            assert _v1(web, "GET", f"/v1/tasks?project_ids={p}&page=0", token)["data"]["total"] == 1
            for other in theirs:
                q = next(k for k, v in made.items() if v == other)
                for method, path, code in (
                        ("GET", f"/v1/task?task_id={other}", 507),
                        ("GET", f"/v1/download/url?task_id={other}", 507),
                        ("GET", f"/v1/download/async?task_id={other}", 507),
                        ("GET", f"/v1/tasks?project_ids={q}&page=0", 502),
                        ("DELETE", f"/v1/tasks?task_ids={other}&project_ids={q}", 502)):
                    got = _v1(web, method, path, token)
                    assert got["status"] == code, (role, p, method, path, got)
                for path in (f"/api/v1/center/tasks/{other[:24]}", f"/api/v1/center/tasks?project_ids={q}",
                             f"/api/v1/exports/{other[:24]}", f"/api/v1/exports/{other[:24]}/file"):
                    assert web.call("GET", path, token).status_code == 404, (role, p, path)
                got = web.call("DELETE", f"/api/v1/center/tasks?task_ids={other[:24]}&project_ids={q}", token)
                assert got.status_code == 404, (role, p, got.text)
                for path in ("/v1/task", "/v1/download/sync"):
                    got = _v1(web, "POST", path, token, json=task(project_id=q, source_data=[]))
                    assert got["status"] == 502, (role, p, path, got)
        assert all(Export.objects.get(id=t[:24]).state == "SUCCESS" for t in made.values())  # nothing deleted


def test_private_sources_where_the_project_allows_them(cluster, monkeypatch, source):
    """SOURCE_ALLOW_PRIVATE off: a project created with --allow-private may pull from loopback,
    another may not; the cluster's services stay refused for both."""
    from common.config import load

    monkeypatch.setenv("DOWNCLUSTER_SOURCE_ALLOW_PRIVATE", "0")
    load()
    made = cli("project", "create", "intranet", "--allow-private")
    assert made.exit_code == 0, made.output
    intranet = int(made.stdout.strip().splitlines()[-1])
    assert center_params.check(task(project_id=intranet, source_url=f"{source}/rows?n=3"))
    with pytest.raises(ValidationError, match="is not a public address"):
        center_params.check(task(project_id=7, source_url=f"{source}/rows?n=3"))
    redis_port = cluster.redis_server.port
    with pytest.raises(ValidationError, match="is not a public address"):
        center_params.check(task(project_id=intranet, source_url=f"http://127.0.0.1:{redis_port}/"))
    export = center.deliver(cluster.redis, task(project_id=intranet, source_url=f"{source}/rows?n=3",
                                                step=100))
    assert run(export).state == "SUCCESS"
