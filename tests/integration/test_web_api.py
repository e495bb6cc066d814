"""The HTTP API over real HTTP against a started ``downcluster web`` (no in-process test client):
tokens and roles, every action's door, bad input, NoSQL-injection attempts, 413, 503."""
from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from common.store.control_models import ApiToken, WebSession
from common.store.log_models import CrawlerRegistrationErrorLog
from common.store.models import CrawlerTask, Job
from services import env_for, free_port
from tests.helpers import add_urls, cli, register, statuses
from tests.web_helpers import WebServer

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def web(redis_server, mongo_server):
    env = env_for(
        redis_server.url, mongo_server.uri("dc_test"), mongo_server.uri("dc_test_log"), HOSTNAME="testhost"
    )
    with WebServer(env, API_MAX_LIMIT=5, API_MAX_BODY=1024 * 1024) as server:
        yield server


def new_token(name: str, role: str, *projects: str) -> str:
    """A token NAME of ROLE holding ``projects`` (ids or names; a user's or analyst's default:
    the ``default`` project, where jobs registered without a project go)."""
    if role != "admin" and not projects:
        projects = ("default",)
    result = cli("token", "create", name, "--role", role, *(f"--project={p}" for p in projects))
    assert result.exit_code == 0, result.output
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture
def tokens(cluster):
    return {"admin": new_token("root", "admin"), "analyst": new_token("ann", "analyst")}


def test_tokens_are_shown_once_and_stored_as_hashes(cluster, web, tokens):
    stored = ApiToken._get_collection().find_one({"name": "root"})
    assert tokens["admin"] not in json.dumps(stored, default=str)
    listing = cli("token", "list").output
    assert "root" in listing and "ann" in listing and tokens["admin"] not in listing
    assert cli("token", "create", "root", "--role", "admin").exit_code == 2  # name taken


def test_no_unknown_or_revoked_token_is_401_and_roles_are_403(cluster, web, tokens, tmp_path):
    register(tmp_path, "j1")
    assert web.call("GET", "/api/v1/jobs").status_code == 401
    assert web.call("GET", "/api/v1/jobs", "dct_not-a-token").status_code == 401
    wrong = web.call("GET", "/api/v1/jobs", headers={"Authorization": "Basic abc"})
    assert wrong.status_code == 401 and set(wrong.json()) == {"error"}
    assert web.call("GET", "/api/v1/jobs", tokens["analyst"]).status_code == 200
    admin_only = [("POST", "/api/v1/jobs", {"json": {"manifest": 'name = "x"\n'}}),
                  ("POST", "/api/v1/jobs/j1/disable", {}), ("POST", "/api/v1/jobs/j1/enable", {}),
                  ("POST", "/api/v1/jobs/j1/tasks", {"data": "http://127.0.0.1/a\n"}),
                  ("POST", "/api/v1/jobs/j1/tasks/cancel", {"json": {}}),
                  ("POST", "/api/v1/jobs/j1/tasks/requeue", {"json": {}}),
                  ("POST", "/api/v1/dispatch", {})]
    for method, path, kw in admin_only:
        r = web.call(method, path, tokens["analyst"], **kw)
        assert r.status_code == 403 and "admin" in r.json()["error"], (path, r.text)
    assert Job.objects.get(name="j1").status == "ON" and CrawlerTask.objects.count() == 0
    assert cli("token", "revoke", "ann").exit_code == 0
    assert web.call("GET", "/api/v1/jobs", tokens["analyst"]).status_code == 401  # at once


def test_register_list_show_enable_disable(cluster, web, tokens, tmp_path):
    admin = tokens["admin"]
    code = "def download(task):\n    return b'x'\n"
    r = web.call(
        "POST",
        "/api/v1/jobs",
        admin,
        json={"manifest": 'name = "py"\ntype = "python"\npriority = 1\n', "code": code},
    )
    assert r.status_code == 201 and r.json() == {"name": "py", "project": 1}
    r = web.call(
        "POST",
        "/api/v1/jobs",
        admin,
        json={"manifest": 'name = "py"\ntype = "python"\npriority = 2\n', "code": code},
    )
    assert r.status_code == 200 and Job.objects.get(name="py").priority == 2
    bad = web.call(
        "POST", "/api/v1/jobs", admin, json={"manifest": 'name = "bad"\ntype = "python"\n', "code": "def x(:"}
    )
    assert bad.status_code == 422 and "does not parse" in bad.json()["error"]
    assert not Job.objects(name="bad") and CrawlerRegistrationErrorLog.objects(name="bad").count() == 1
    assert web.call("POST", "/api/v1/jobs", admin, json={"manifest": "not = [toml"}).status_code == 422
    jobs = web.call("GET", "/api/v1/jobs", tokens["analyst"]).json()["jobs"]
    assert [(j["name"], j["type"], j["priority"], j["status"]) for j in jobs] == [("py", "python", 2, "ON")]
    assert set(jobs[0]["counts"]) >= {"LIVE", "SUCCESS", "FAIL", "DEAD"}
    assert web.call("POST", "/api/v1/jobs/py/disable", admin).json()["status"] == "OFF"
    assert Job.objects.get(name="py").status == "OFF"
    assert web.call("POST", "/api/v1/jobs/py/enable", admin).json()["status"] == "ON"
    shown = web.call("GET", "/api/v1/jobs/py", tokens["analyst"]).json()
    assert shown["name"] == "py" and shown["settings"]["max_retry_times"] >= 0
    for path in ("/api/v1/jobs/nope", "/api/v1/jobs/nope/tasks", "/api/v1/jobs/nope/data"):
        assert web.call("GET", path, admin).status_code == 404
    assert web.call("POST", "/api/v1/jobs/nope/disable", admin).status_code == 404


def test_tasks_add_list_page_cancel_requeue(cluster, web, tokens, tmp_path):
    admin = tokens["admin"]
    register(tmp_path, "j")
    r = web.call("POST", "/api/v1/jobs/j/tasks", admin, data="http://127.0.0.1/a\nftp://x\nhttp://127.0.0.1/a\n",
                 headers={"Content-Type": "text/plain"})
    assert r.json() == {
        "added": 1,
        "duplicate": 1,
        "rejected": [{"line": 2, "reason": "scheme must be http or https, got 'ftp'"}],
    }
    r = web.call(
        "POST", "/api/v1/jobs/j/tasks", admin, json={"urls": [f"http://127.0.0.1/p{i}" for i in range(7)]}
    )
    assert r.json()["added"] == 7
    seen, after = [], None
    while True:  # limit is clamped to API_MAX_LIMIT=5 on this server
        page = web.call("GET", "/api/v1/jobs/j/tasks", tokens["analyst"],
                        params={"limit": 1000, **({"after": after} if after else {})}).json()
        assert len(page["tasks"]) <= 5
        seen += [t["uri"] for t in page["tasks"]]
        after = page["next"]
        if not after:
            break
    assert len(seen) == len(set(seen)) == 8
    assert web.call("POST", "/api/v1/jobs/j/tasks/cancel", admin, json={"status": ["LIVE"]}).json() == {
        "cancelled": 8
    }
    assert (
        web.call("GET", "/api/v1/jobs/j/tasks?status=CANCEL", admin).json()["tasks"][0]["status"] == "CANCEL"
    )
    assert web.call("POST", "/api/v1/jobs/j/tasks/requeue", admin, json={"status": ["CANCEL"]}).json() == {
        "requeued": 8
    }
    assert statuses("j") == {"LIVE": 8}
    assert (
        web.call("POST", "/api/v1/jobs/j/tasks/requeue", admin, json={"status": ["LIVE"]}).status_code == 422
    )


INJECTIONS = [
    ("GET", "/api/v1/jobs/j/tasks?status[$ne]=x", {}),
    ("GET", "/api/v1/jobs/j/tasks?status=%7B%22%24ne%22%3A%22x%22%7D", {}),
    ("GET", "/api/v1/jobs/j/tasks?after[$gt]=0", {}),
    ("GET", "/api/v1/jobs/j/tasks?after=%7B%22%24gt%22%3A0%7D", {}),
    ("GET", "/api/v1/jobs/j/data?after[$gt]=0", {}),
    ("GET", "/api/v1/jobs/j/data?after=%7B%22%24gt%22%3A0%7D", {}),
    ("GET", "/api/v1/logs/download?job[$ne]=x", {}),
    ("GET", "/api/v1/logs/download?after[$gt]=0", {}),
    ("GET", "/api/v1/jobs/j/tasks?limit[$gt]=1", {}),
    ("POST", "/api/v1/jobs/j/tasks", {"json": {"urls": {"$gt": ""}}}),
    ("POST", "/api/v1/jobs/j/tasks", {"json": {"urls": ["http://127.0.0.1/x"], "host": {"$ne": ""}}}),
    ("POST", "/api/v1/jobs/j/tasks/requeue", {"json": {"status": {"$ne": "SUCCESS"}}}),
    ("POST", "/api/v1/jobs/j/tasks/cancel", {"json": {"status": [{"$ne": "x"}]}}),
    ("POST", "/api/v1/jobs", {"json": {"manifest": {"$ne": ""}}}),
    ("POST", "/api/v1/session", {"json": {"token": {"$ne": ""}}}),
]


@pytest.mark.parametrize("method,path,kw", INJECTIONS, ids=[f"{m} {p} {k}"[:70] for m, p, k in INJECTIONS])
def test_nosql_injection_is_refused(cluster, web, tokens, tmp_path, method, path, kw):
    register(tmp_path, "j")
    add_urls("j", ["http://127.0.0.1/a"])
    r = web.call(method, path, tokens["admin"], **kw)
    assert r.status_code == 422, r.text
    assert set(r.json()) == {"error"} and "\n" not in r.json()["error"]
    assert statuses("j") == {"LIVE": 1} and WebSession.objects.count() == 0


def test_a_json_object_where_a_job_name_belongs_finds_nothing(cluster, web, tokens):
    r = web.call("GET", "/api/v1/logs/download", tokens["admin"], params={"job": '{"$ne": null}'})
    assert r.status_code == 404  # looked up as the literal name


def test_bad_ids_limits_and_unknown_paths(cluster, web, tokens, tmp_path):
    admin = tokens["admin"]
    register(tmp_path, "j")
    for bad in ("123", "zzzzzzzzzzzzzzzzzzzzzzzz"):  # not an id, as the description says: 422
        assert web.call("GET", f"/api/v1/data/{bad}/body", admin).status_code == 422
    assert web.call("GET", "/api/v1/data/5f0000000000000000000000/body", admin).status_code == 404
    assert web.call("GET", "/api/v1/jobs/j/tasks?after=nope", admin).status_code == 422
    assert web.call("GET", "/api/v1/jobs/j/tasks?limit=many", admin).status_code == 422
    assert web.call("GET", "/api/v1/logs/nope", admin).status_code == 422
    r = web.call("GET", "/api/v1/nothing-here", admin)
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = web.call(
        "POST", "/api/v1/jobs/j/tasks", admin, data=b"<x/>", headers={"Content-Type": "application/xml"}
    )
    assert r.status_code == 415


def _raw(web, request: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    conn.connect()
    conn.sock.sendall(request)
    resp = http.client.HTTPResponse(conn.sock)
    resp.begin()
    status, body = resp.status, resp.read().decode()
    conn.close()
    return status, body


def test_oversized_bodies_are_413_before_they_are_read(cluster, web, tokens, tmp_path):
    register(tmp_path, "j")
    head = (f"POST /api/v1/jobs/j/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tokens['admin']}\r\n"
            "Content-Type: text/plain\r\n")
    status, body = _raw(web, (head + "Content-Length: 99999999\r\n\r\n").encode())  # and no body is sent
    assert status == 413 and json.loads(body)["error"].startswith("request body over API_MAX_BODY")
    chunk = b"http://127.0.0.1/" + b"a" * 65536 + b"\n"
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
    status, body = _raw(web, (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + chunked)
    assert status == 413
    assert CrawlerTask.objects.count() == 0


def test_dispatch_stats_data_body_and_logs(cluster, web, tokens, tmp_path):
    from master.dispatch.lock import DispatchLock
    from sample_site import bytes_body, page_body

    admin = tokens["admin"]
    register(tmp_path, "j")
    add_urls("j", [f"{cluster.site}/page/{i}" for i in range(3)] + [f"{cluster.site}/bytes/300000"])
    with DispatchLock(cluster.redis):
        r = web.call("POST", "/api/v1/dispatch", admin)
        assert r.status_code == 409 and "dispatcher" in r.json()["error"].lower()
    report = web.call("POST", "/api/v1/dispatch", admin).json()
    assert report["total"] == 4 and report["tasks"] == {"down_low": 4}
    api_stats = web.call("GET", "/api/v1/stats", tokens["analyst"]).json()
    cli_stats = json.loads(cli("stats", "--json").stdout)
    assert api_stats["jobs"] == cli_stats["jobs"]
    assert [(q["queue"], q["depth"]) for q in api_stats["queues"]] == [
        (q["queue"], q["depth"]) for q in cli_stats["queues"]
    ]
    worker = subprocess.run(
        [str(BIN / "downcluster"), "worker", "--burst"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cluster.env, "DOWNCLUSTER_GRIDFS_THRESHOLD": "100000"},
    )
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert statuses("j") == {"SUCCESS": 4}
    items, after = [], None
    while True:
        page = web.call(
            "GET", "/api/v1/jobs/j/data", tokens["analyst"], params={"after": after} if after else {}
        ).json()
        items += page["data"]
        after = page["next"]
        if not after:
            break
    assert len(items) == 4 and set(items[0]) == {"id", "url", "status_code", "task", "size", "add_datetime"}
    for item in items:
        want = (
            bytes_body(300000) if "/bytes/" in item["url"] else page_body(int(item["url"].rsplit("/", 1)[1]))
        )
        got = web.call("GET", f"/api/v1/data/{item['id']}/body", tokens["analyst"])
        assert got.status_code == 200 and got.content == want and item["size"] == len(want)
        assert (
            got.headers["content-type"] == "application/octet-stream"
            and "attachment" in got.headers["content-disposition"]
        )
    from common.store.models import CrawlerDownloadData

    assert (
        CrawlerDownloadData.objects(response_body_gridfs__ne=None).count() == 1
    )  # the large one is in GridFS
    logs = web.call("GET", "/api/v1/logs/download?job=j&limit=2", tokens["analyst"]).json()
    assert len(logs["logs"]) == 2 and logs["next"] and logs["logs"][0]["job"] == "j"
    rest = web.call("GET", f"/api/v1/logs/download?job=j&after={logs['next']}", tokens["analyst"]).json()
    assert len(rest["logs"]) == 2 and not {x["id"] for x in rest["logs"]} & {x["id"] for x in logs["logs"]}
    assert web.call("GET", "/api/v1/logs/dispatch", tokens["analyst"]).json()["logs"][0]["count"] == 4


def test_openapi_describes_the_api_and_cors_is_off(cluster, web):
    spec = requests.get(web.base + "/api/v1/openapi.json", timeout=10).json()
    for path in ("/api/v1/jobs", "/api/v1/jobs/{name}/tasks", "/api/v1/dispatch", "/api/v1/stats",
                 "/api/v1/data/{data_id}/body", "/api/v1/logs/{log}"):
        assert path in spec["paths"], path
    r = requests.options(
        web.base + "/api/v1/jobs",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        timeout=10,
    )
    assert "access-control-allow-origin" not in r.headers


def test_console_session_cookie_csrf_and_sign_out(cluster, web, tokens, tmp_path):
    register(tmp_path, "j")
    s = requests.Session()
    assert s.post(web.base + "/api/v1/session", json={"token": "wrong"}, timeout=10).status_code == 401
    r = s.post(web.base + "/api/v1/session", json={"token": tokens["admin"]}, timeout=10)
    assert r.status_code == 200 and r.json()["role"] == "admin"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert tokens["admin"] not in cookie
    csrf = r.json()["csrf"]
    assert s.get(web.base + "/api/v1/jobs", timeout=10).status_code == 200
    assert s.post(web.base + "/api/v1/jobs/j/disable", timeout=10).status_code == 403  # no CSRF token
    assert (
        s.post(
            web.base + "/api/v1/jobs/j/disable", headers={"X-CSRF-Token": "x" + csrf}, timeout=10
        ).status_code
        == 403
    )
    assert Job.objects.get(name="j").status == "ON"
    assert (
        s.post(web.base + "/api/v1/jobs/j/disable", headers={"X-CSRF-Token": csrf}, timeout=10).status_code
        == 200
    )
    old = dict(s.cookies)
    assert s.post(web.base + "/api/v1/session/end", timeout=10).status_code == 200
    assert (
        requests.get(web.base + "/api/v1/jobs", cookies=old, timeout=10).status_code == 401
    )  # ended server-side
    s2 = requests.Session()
    s2.post(web.base + "/api/v1/session", json={"token": tokens["analyst"]}, timeout=10)
    assert s2.get(web.base + "/api/v1/jobs", timeout=10).status_code == 200
    cli("token", "revoke", "ann")
    assert s2.get(web.base + "/api/v1/jobs", timeout=10).status_code == 401
    page = requests.get(web.base + "/", timeout=10)
    assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "http" not in page.text.split("<body>")[0].replace('href="/static', "").replace('src="/static', "")


def test_unreachable_services_are_a_503_naming_them_and_exit_1(cluster, redis_server, mongo_server):
    dead_mongo = f"mongodb://user:hunter2@127.0.0.1:{free_port()}/x"
    env = env_for(redis_server.url, dead_mongo, dead_mongo)
    with WebServer(env, MONGO_TIMEOUT="0.5") as server:
        r = server.call("GET", "/api/v1/jobs", "dct_whatever")
        assert r.status_code == 503
        assert r.json()["error"] == f"MongoDB unreachable at {dead_mongo.split('@')[1].split('/')[0]}"
    assert "hunter2" not in server.output
    proc = subprocess.run([str(BIN / "downcluster"), "stats"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env, "DOWNCLUSTER_MONGO_TIMEOUT": "0.5"})
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        r.json()["error"].join(["error: ", ""])
    ]
    dead_redis = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    env = env_for(dead_redis, mongo_server.uri("dc_test"), mongo_server.uri("dc_test_log"))
    token = new_token("r", "analyst")
    with WebServer(env) as server:
        r = server.call("GET", "/api/v1/stats", token)
        assert r.status_code == 503 and r.json()["error"].startswith("Redis unreachable at 127.0.0.1:")
        assert "hunter2" not in r.text
    proc = subprocess.run([str(BIN / "downcluster"), "stats"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert proc.returncode == 1 and proc.stderr.startswith("error: Redis unreachable at 127.0.0.1:")
