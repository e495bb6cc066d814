"""Projects, roles, the upgrade to projects, a failed export retried by hand, and the audit log.

Three projects, a user and an analyst token of each: every route that names something of another
project answers 404 (the same as a name nobody uses), listings, counts and /metrics show only the
token's projects, roles decide what a token may change (403 only for what it sees)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from datetime import datetime
from pathlib import Path

import pytest
from bson import ObjectId

from common.store.control_models import ApiToken, Project
from common.store.models import Export, Job
from master.dispatch.dispatcher import dispatch_once
from master.exports import service as exports
from slave.exporter import run_export
from tests.helpers import add_urls, burst_worker, cli, write_job
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

NAMES = ("alpha", "beta", "gamma")


def _project(name: str) -> int:
    result = cli("project", "create", name)
    assert result.exit_code == 0, result.output
    return int(result.stdout.strip().splitlines()[-1])


def _register(tmp_path, job: str, project: int | str) -> None:
    result = cli("job", "register", str(write_job(tmp_path, job)), "--project", str(project))
    assert result.exit_code == 0, result.output


@pytest.fixture
def three(cluster, tmp_path):
    """Projects alpha, beta, gamma, a job of each with 2 stored pages and a finished export, and
    a user and an analyst token of each project (plus an admin)."""
    ids = {name: _project(name) for name in NAMES}
    assert sorted(ids.values()) == [1, 2, 3]  # assigned by the cluster
    for name in NAMES:
        _register(tmp_path, f"job-{name}", ids[name])
        add_urls(f"job-{name}", [f"{cluster.site}/page/{i}" for i in range(2)])
    assert dispatch_once(cluster.redis).total == 6
    burst_worker(cluster, "--no-exports")
    toks = {"admin": new_token("root", "admin")}
    for name in NAMES:
        toks[f"user-{name}"] = new_token(f"user-{name}", "user", name)
        toks[f"analyst-{name}"] = new_token(f"analyst-{name}", "analyst", str(ids[name]))
    return ids, toks


def _ids_of(web, admin: str, job: str) -> dict:
    """A task id, a data id and a finished export id of ``job`` (read as the admin)."""
    task = web.call("GET", f"/api/v1/jobs/{job}/tasks", admin).json()["tasks"][0]
    data = web.call("GET", f"/api/v1/jobs/{job}/data", admin).json()["data"][0]
    made = web.call("POST", "/api/v1/exports", admin, json={"job": job, "format": "csv"}).json()
    assert run_export(made["id"], "w1") == "success"
    return {"task": task["id"], "url": task["uri"], "data": data["id"], "export": made["id"]}


def _routes(job: str, ids: dict, project: int) -> list[tuple[str, str, dict]]:
    """Every route that names ``job`` or one of its things, with a body where it takes one."""
    e = ids["export"]
    return [
        ("GET", f"/api/v1/jobs/{job}", {}),
        ("GET", f"/api/v1/jobs/{job}/tasks", {}),
        ("GET", f"/api/v1/jobs/{job}/tasks/lookup", {"params": {"url": ids["url"]}}),
        ("GET", f"/api/v1/tasks/{ids['task']}", {}),
        ("GET", f"/api/v1/jobs/{job}/data", {}),
        ("GET", f"/api/v1/data/{ids['data']}/body", {}),
        ("GET", f"/api/v1/jobs/{job}/generator", {}),
        ("GET", "/api/v1/logs/download", {"params": {"job": job}}),
        ("GET", "/api/v1/logs/alert", {"params": {"job": job}}),
        ("GET", f"/api/v1/jobs/{job}/export", {}),
        ("POST", f"/api/v1/jobs/{job}/export", {"json": {"format": "csv"}}),
        ("POST", "/api/v1/exports", {"json": {"job": job, "format": "csv"}}),
        ("GET", "/api/v1/exports", {"params": {"job": job}}),  # an empty list, checked apart
        ("GET", f"/api/v1/exports/{e}", {}),
        ("GET", f"/api/v1/exports/{e}/file", {}),
        ("GET", f"/api/v1/exports/{e}/link", {}),
        ("POST", f"/api/v1/exports/{e}/cancel", {}),
        ("POST", f"/api/v1/exports/{e}/retry", {}),
        ("POST", f"/api/v1/jobs/{job}/enable", {}),
        ("POST", f"/api/v1/jobs/{job}/disable", {}),
        ("POST", f"/api/v1/jobs/{job}/tasks", {"json": {"urls": ["http://127.0.0.1:1/x"]}}),
        ("POST", f"/api/v1/jobs/{job}/tasks/cancel", {"json": {}}),
        ("POST", f"/api/v1/jobs/{job}/tasks/requeue", {"json": {}}),
        ("POST", f"/api/v1/jobs/{job}/generator/on", {}),
        ("POST", f"/api/v1/jobs/{job}/generator/off", {}),
        ("POST", f"/api/v1/jobs/{job}/generator/run", {}),
        ("POST", f"/api/v1/jobs/{job}/dry-run", {"json": {"url": "http://127.0.0.1:1/x"}}),
        ("GET", f"/api/v1/jobs/{job}/dry-run/{'0' * 32}", {}),
        ("POST", "/api/v1/jobs", {"json": {"manifest": f'name = "{job}"\ntype = "none"\n'}}),
        ("POST", "/api/v1/jobs", {"json": {"manifest": 'name = "fresh"\ntype = "none"\n',
                                           "project": project}}),
        ("GET", f"/api/v1/projects/{project}", {}),
    ]


def test_nothing_of_another_project_is_visible_and_naming_it_answers_404(cluster, three):
    from websockets.sync.client import connect

    ids, toks = three
    with WebServer(cluster.env) as web:
        things = {name: _ids_of(web, toks["admin"], f"job-{name}") for name in NAMES}
        for mine in NAMES:
            for role in ("user", "analyst"):
                token = toks[f"{role}-{mine}"]
                for other in NAMES:
                    if other == mine:
                        continue
                    for method, path, kw in _routes(f"job-{other}", things[other], ids[other]):
                        got = web.call(method, path, token, **kw)
                        if path == "/api/v1/exports" and method == "GET":
                            assert got.status_code == 200 and got.json()["exports"] == []
                            continue
                        assert got.status_code == 404, (role, mine, method, path, got.status_code, got.text)
                        assert "error" in got.json()
                        if path == f"/api/v1/jobs/job-{other}":  # word for word a name nobody uses
                            assert got.json()["error"] == f"no job named 'job-{other}'"
                    export_id = things[other]["export"]
                    ws_url = web.base.replace("http", "ws") + f"/api/v1/exports/{export_id}/events"
                    with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"},
                                 open_timeout=10) as ws:
                        assert "error" in json.loads(ws.recv(timeout=10))
                # listings and counts: its own project's only
                jobs = web.call("GET", "/api/v1/jobs", token).json()["jobs"]
                assert [j["name"] for j in jobs] == [f"job-{mine}"] and jobs[0]["project"] == ids[mine]
                stats = web.call("GET", "/api/v1/stats", token).json()
                assert [r["job"] for r in stats["jobs"]] == [f"job-{mine}"]
                overview = web.call("GET", "/api/v1/overview", token).json()
                assert [r["job"] for r in overview["jobs"]] == [f"job-{mine}"]
                assert overview["throttled_hosts"] == [] and "last_hour" in overview
                logs = web.call("GET", "/api/v1/logs/download", token).json()["logs"]
                assert logs and {entry["job"] for entry in logs} == {f"job-{mine}"}
                types = web.call("GET", "/api/v1/types", token).json()["types"]
                assert {t["language"]: t["jobs"] for t in types}["none"] == 1  # its own job only
                projects = web.call("GET", "/api/v1/projects", token).json()["projects"]
                assert [p["id"] for p in projects] == [ids[mine]]
                assert web.call("GET", "/api/v1/session", token).json()["projects"] == [ids[mine]]
                metrics = web.call("GET", "/metrics", token).text
                assert f'job="job-{mine}"' in metrics
                assert not any(f'job="job-{other}"' in metrics for other in NAMES if other != mine)
                assert "downcluster_exports" not in metrics
                # what it holds, it reads
                own = things[mine]
                assert web.call("GET", f"/api/v1/tasks/{own['task']}", token).status_code == 200
                assert web.call("GET", f"/api/v1/data/{own['data']}/body", token).status_code == 200
        # the admin sees every project
        assert len(web.call("GET", "/api/v1/jobs", toks["admin"]).json()["jobs"]) == 3
        every = web.call("GET", "/api/v1/projects", toks["admin"]).json()["projects"]
        assert {p["name"] for p in every} - {"default"} == set(NAMES)  # default: made on first use
        assert 'job="job-gamma"' in web.call("GET", "/metrics", toks["admin"]).text


def test_roles_decide_what_a_token_may_change(cluster, three, tmp_path):
    ids, toks = three
    with WebServer(cluster.env) as web:
        user, analyst = toks["user-alpha"], toks["analyst-alpha"]
        # the analyst reads and exports its project's job, and changes nothing
        assert web.call("GET", "/api/v1/jobs/job-alpha", analyst).status_code == 200
        made = web.call("POST", "/api/v1/exports", analyst, json={"job": "job-alpha", "format": "jsonl"})
        assert made.status_code == 202
        for method, path, kw in [
            ("POST", "/api/v1/jobs/job-alpha/disable", {}),
            ("POST", "/api/v1/jobs/job-alpha/tasks", {"json": {"urls": ["http://127.0.0.1:1/y"]}}),
            ("POST", "/api/v1/jobs/job-alpha/tasks/cancel", {"json": {}}),
            ("POST", "/api/v1/jobs/job-alpha/dry-run", {"json": {"url": "http://127.0.0.1:1/y"}}),
            ("POST", "/api/v1/jobs", {"json": {"manifest": 'name = "new-a"\ntype = "none"\n'}}),
            ("POST", "/api/v1/projects", {"json": {"name": "delta"}}),
            ("GET", "/api/v1/audit", {}),
            ("POST", "/api/v1/types/shell/disable", {}),
            ("POST", "/api/v1/dispatch", {}),
        ]:
            assert web.call(method, path, analyst, **kw).status_code == 403, path
        # the user runs its project's jobs and registers new ones there, nothing of the cluster's
        assert web.call("POST", "/api/v1/jobs/job-alpha/disable", user).json()["status"] == "OFF"
        assert web.call("POST", "/api/v1/jobs/job-alpha/enable", user).json()["status"] == "ON"
        added = web.call("POST", "/api/v1/jobs/job-alpha/tasks", user,
                         json={"urls": [f"{cluster.site}/page/9"]})
        assert added.status_code == 200 and added.json()["added"] == 1
        fresh = web.call("POST", "/api/v1/jobs", user, json={"manifest": 'name = "new-a"\ntype = "none"\n'})
        assert fresh.status_code == 201 and fresh.json() == {"name": "new-a", "project": ids["alpha"]}
        assert Job.objects.get(name="new-a").project == ids["alpha"]
        moved = web.call("POST", "/api/v1/jobs", user, json={
            "manifest": 'name = "new-a"\ntype = "none"\n', "project": ids["beta"]})
        assert moved.status_code == 404  # not a project it holds
        for method, path, kw in [("POST", "/api/v1/projects", {"json": {"name": "delta"}}),
                                 ("GET", "/api/v1/audit", {}), ("POST", "/api/v1/dispatch", {})]:
            assert web.call(method, path, user, **kw).status_code == 403, path
        # a user of two projects names the project of a new job
        two = new_token("both", "user", "alpha", "beta")
        unsure = web.call("POST", "/api/v1/jobs", two, json={"manifest": 'name = "new-b"\ntype = "none"\n'})
        assert unsure.status_code == 404 and "project" in unsure.json()["error"]
        sure = web.call("POST", "/api/v1/jobs", two, json={"manifest": 'name = "new-b"\ntype = "none"\n',
                                                           "project": ids["beta"]})
        assert sure.status_code == 201 and Job.objects.get(name="new-b").project == ids["beta"]
        # the admin makes projects; the CLI lists and shows them
        made_project = web.call("POST", "/api/v1/projects", toks["admin"], json={"name": "delta"})
        assert made_project.status_code == 201 and made_project.json()["id"] > max(ids.values())
        assert web.call("POST", "/api/v1/projects", toks["admin"], json={"name": "delta"}).status_code == 409
    listed = cli("project", "list", "--json")
    names = [p["name"] for p in json.loads(listed.stdout)["projects"]]
    assert [n for n in names if n != "default"] == [*NAMES, "delta"]
    shown = json.loads(cli("project", "show", "alpha", "--json").stdout)
    assert shown["jobs"] == ["job-alpha", "new-a"] and {"user-alpha", "both"} <= set(shown["tokens"])
    assert cli("project", "show", "nope").exit_code != 0


def test_upgrade_puts_a_store_written_before_projects_into_default(cluster, tmp_path):
    """The store as the code before projects wrote it: jobs, exports and tokens without any
    project field (unset here), then ``migrate``."""
    write = write_job(tmp_path, "old")
    assert cli("job", "register", str(write)).exit_code == 0
    add_urls("old", [f"{cluster.site}/page/1"])
    old_analyst, old_admin = new_token("ann", "analyst"), new_token("root", "admin")
    old_export = exports.request(cluster.redis, "old", "csv", requested_by="ann",
                                 owner=ApiToken.objects.get(name="ann").id).export
    Job._get_collection().update_many({}, {"$unset": {"project": 1}})
    Export._get_collection().update_many({}, {"$unset": {"project": 1}})
    ApiToken._get_collection().update_many({}, {"$unset": {"projects": 1}})
    Project._get_collection().delete_many({})
    with WebServer(cluster.env) as web:
        # before migrate: an old analyst holds nothing yet; the admin sees all
        assert web.call("GET", "/api/v1/jobs/old", old_admin).status_code == 200
        result = cli("migrate")
        assert result.exit_code == 0
        assert "put 1 jobs, 1 exports and 1 tokens into project default" in result.output
        default = Project.objects.get(name="default").id
        assert Job.objects.get(name="old").project == default
        assert Export.objects.get(id=old_export.id).project == default
        assert ApiToken.objects.get(name="ann").projects == [default]
        # what each token could do before, it still can
        assert web.call("GET", "/api/v1/jobs/old", old_analyst).status_code == 200
        assert web.call("GET", "/api/v1/jobs/old/tasks", old_analyst).json()["tasks"]
        assert web.call("GET", f"/api/v1/exports/{old_export.id}", old_analyst).status_code == 200
        assert web.call("POST", "/api/v1/jobs/old/disable", old_analyst).status_code == 403
        assert web.call("POST", "/api/v1/jobs/old/disable", old_admin).status_code == 200
        # a token made after the upgrade holds only what it is given (given nothing: default)
        late = cli("token", "create", "late", "--role", "analyst").stdout.strip().splitlines()[-1]
        assert web.call("GET", "/api/v1/jobs/old", late).status_code == 200
        _project("other")
        nobody = cli("token", "create", "nobody", "--role", "analyst", "--project", "other")
        nobody_token = nobody.stdout.strip().splitlines()[-1]
        assert web.call("GET", "/api/v1/jobs/old", nobody_token).status_code == 404
        again = cli("migrate")
        assert "put 0 jobs, 0 exports and 0 tokens" in again.output
        assert web.call("GET", "/api/v1/jobs/old", nobody_token).status_code == 404


def _code_before_projects(tmp_path) -> Path | None:
    """This checkout's code as it was before projects (the parent of the commit that added
    master/access.py), unpacked under ``tmp_path``; None without git history."""
    root = Path(__file__).resolve().parents[2]
    try:
        added = subprocess.run(
            ["git", "log", "--format=%H", "-1", "--diff-filter=A", "--", "master/access.py"],
            cwd=root, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
        if not added:
            return None
        old = tmp_path / "before-projects"
        old.mkdir()
        archive = subprocess.run(["git", "archive", f"{added}^"], cwd=root, capture_output=True,
                                 timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(old, filter="data")
    return old


def test_upgrade_of_a_store_written_by_the_code_before_projects(cluster, tmp_path):
    """The store written by the previous version's own commands (its code run from git), then
    this version's ``migrate``: jobs and exports go to ``default``, the old analyst keeps reading
    what it read, the old admin keeps everything."""
    old = _code_before_projects(tmp_path)
    if old is None:
        pytest.skip("no git history to take the code before projects from")
    env = {**os.environ, **cluster.env, "PYTHONPATH": str(old)}

    def old_cli(*args: str, input: str | None = None) -> str:
        done = subprocess.run([sys.executable, "-c", "from common.cli import main; main()", *args], cwd=old,
                              env=env, input=input, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert "access.py" not in os.listdir(old / "master")
    old_cli("job", "register", str(write_job(tmp_path, "legacy")))
    old_cli("task", "add", "legacy", "-", input=f"{cluster.site}/page/1\n")
    analyst = old_cli("token", "create", "ann", "--role", "analyst").strip().splitlines()[-1]
    admin = old_cli("token", "create", "root", "--role", "admin").strip().splitlines()[-1]
    export_id = old_cli("export", "request", "legacy", "--format", "csv").strip().splitlines()[-1]
    assert "project" not in Job._get_collection().find_one({"name": "legacy"})
    assert "projects" not in ApiToken._get_collection().find_one({"name": "ann"})
    result = cli("migrate")
    assert result.exit_code == 0
    assert "put 1 jobs, 1 exports and 1 tokens into project default" in result.output
    default = Project.objects.get(name="default").id
    assert Job.objects.get(name="legacy").project == default == Export.objects.get(id=export_id).project
    with WebServer(cluster.env) as web:
        for token in (analyst, admin):
            assert web.call("GET", "/api/v1/jobs/legacy", token).status_code == 200
            assert web.call("GET", "/api/v1/jobs/legacy/tasks", token).json()["tasks"]
        assert web.call("GET", f"/api/v1/exports/{export_id}", admin).status_code == 200
        made = web.call("POST", "/api/v1/exports", analyst, json={"job": "legacy", "format": "jsonl"})
        assert made.status_code == 202
        assert web.call("POST", "/api/v1/jobs/legacy/disable", analyst).status_code == 403
        assert web.call("POST", "/api/v1/jobs/legacy/disable", admin).status_code == 200


def test_a_failed_export_is_retried_by_hand(cluster, tmp_path):
    from tests.integration.test_exports import _job_with_pages

    _job_with_pages(cluster, tmp_path, n=2)
    ann, bob = new_token("ann", "analyst"), new_token("bob", "analyst")

    def failed(owner_name: str | None) -> str:
        owner = ApiToken.objects.get(name=owner_name).id if owner_name else None
        made = exports.request(cluster.redis, "j", "csv", requested_by=owner_name or "cli", owner=owner,
                               flt={"since": f"2020-01-0{Export.objects.count() + 1}T00:00:00Z"}).export
        Export._get_collection().update_one({"_id": made.id}, {"$set": {
            "state": "FAIL", "attempts": 5, "error": "it broke", "finished_at": datetime(2026, 1, 1)}})
        cluster.redis.delete("rq:queue:down_export")
        return str(made.id)

    by_cli = failed(None)
    result = cli("export", "retry", by_cli)
    assert result.exit_code == 0 and "PENDING" in result.output
    export = Export.objects.get(id=by_cli)
    assert export.state == "PENDING" and export.attempts == 0 and export.error is None
    assert export.finished_at is None
    assert cluster.redis.lrange("rq:queue:down_export", 0, -1) == [f"dcx-{by_cli}".encode()]
    assert run_export(by_cli, "w1") == "success"
    again = cli("export", "retry", by_cli)
    assert again.exit_code != 0 and "only a FAIL export" in again.output
    by_api = failed("ann")
    with WebServer(cluster.env) as web:
        assert web.call("POST", f"/api/v1/exports/{by_api}/retry", bob).status_code == 404  # not bob's
        assert web.call("POST", f"/api/v1/exports/{ObjectId()}/retry", ann).status_code == 404
        got = web.call("POST", f"/api/v1/exports/{by_api}/retry", ann)
        assert got.status_code == 200 and got.json()["state"] == "PENDING" and got.json()["attempts"] == 0
        assert web.call("POST", f"/api/v1/exports/{by_api}/retry", ann).status_code == 409
    assert run_export(by_api, "w1") == "success"


def test_the_audit_log_tells_who_did_what(cluster, tmp_path):
    assert cli("project", "create", "shop").exit_code == 0
    _register(tmp_path, "j", "shop")
    root = new_token("root", "admin")
    user = new_token("u1", "user", "shop")
    assert cli("token", "grant", "u1", "--project", "default").exit_code == 0
    assert cli("job", "disable", "j").exit_code == 0
    with WebServer(cluster.env) as web:
        assert web.call("POST", "/api/v1/jobs/j/enable", user).status_code == 200
        urls = {"urls": [f"{cluster.site}/page/1"]}
        assert web.call("POST", "/api/v1/jobs/j/tasks", user, json=urls).json()["added"] == 1
        made = web.call("POST", "/api/v1/exports", user, json={"job": "j", "format": "csv"}).json()
        assert web.call("POST", f"/api/v1/exports/{made['id']}/cancel", user).status_code == 200
        assert web.call("POST", "/api/v1/projects", root, json={"name": "ops"}).status_code == 201
        assert web.call("GET", "/api/v1/audit", user).status_code == 403
        page = web.call("GET", "/api/v1/audit", root, params={"limit": 3}).json()
        assert [e["action"] for e in page["entries"]] == ["project.create", "export.cancel", "export.request"]
        assert page["entries"][1]["actor"] == "u1" and page["entries"][1]["role"] == "user"
        rest = web.call("GET", "/api/v1/audit", root, params={"before": page["next"], "limit": 100}).json()
        assert rest["next"] is None
    assert cli("token", "revoke", "u1").exit_code == 0
    shown = json.loads(cli("audit", "--json", "--limit", "100").stdout)["entries"]
    actions = [e["action"] for e in reversed(shown)]
    assert actions == ["project.create", "job.register", "token.create", "token.create", "token.grant",
                       "job.off", "job.on", "tasks.add", "export.request", "export.cancel", "project.create",
                       "token.revoke"]
    added = next(e for e in shown if e["action"] == "tasks.add")
    assert added["actor"] == "u1" and added["detail"] == {"added": 1}
    first = shown[-1]
    assert first["actor"].startswith("cli") and first["target"] == "1" and first["detail"] == {"name": "shop"}
    on = next(e for e in shown if e["action"] == "job.on")
    assert on["actor"] == "u1" and on["target"] == "j" and on["project"] == 1
    assert "job.off" in cli("audit").stdout


def test_a_token_made_without_a_project_holds_default_at_every_door(cluster, tmp_path):
    """`token create NAME --role analyst` as README writes it (no --project) holds `default`,
    where a job registered without a project goes: the command says so, `token list` and the
    API's session show it, and the API lists that job; `master.tokens.create` (what any other
    door calls) gives the same. Before, such a token held nothing and saw no job."""
    from master import tokens

    result = cli("job", "register", str(write_job(tmp_path, "plainjob")))
    assert result.exit_code == 0, result.output
    other = _project("elsewhere")
    _register(tmp_path, "hidden", other)
    made = subprocess.run([str(Path(sys.executable).parent / "downcluster"), "token", "create", "alice",
                           "--role", "analyst"], env={**os.environ, **cluster.env}, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert "holds project default" in made.stderr
    default = Project.objects.get(name="default").id
    assert ApiToken.objects.get(name="alice").projects == [default]
    listed = cli("token", "list").output
    assert any(line.startswith("alice") and f" {default} " in line for line in listed.splitlines()), listed
    direct = tokens.create("bob", "user")
    assert ApiToken.objects.get(name="bob").projects == [default]
    with WebServer(cluster.env) as web:
        for secret in (made.stdout.strip().splitlines()[-1], direct):
            assert web.call("GET", "/api/v1/session", secret).json()["projects"] == [default]
            names = [j["name"] for j in web.call("GET", "/api/v1/jobs", secret).json()["jobs"]]
            assert names == ["plainjob"]
    admin = tokens.create("carol", "admin")
    assert admin and ApiToken.objects.get(name="carol").projects == []


def test_the_roles_that_may_change_a_job_are_shown_its_proxy_cookie_and_headers(cluster, tmp_path):
    """A user (or admin) of the job's project reads back its proxy (the password masked), cookie
    and headers' values, and a change that hands back the masked proxy keeps the stored one; an
    analyst reads them masked, as before."""
    from common.store.models import CrawlerDownloadSetting

    project = _project("secrets")
    proxy = "http://bob:s3cret@proxy.example.com:3128"
    manifest = write_job(tmp_path, "guarded", proxy=proxy, cookie="sid=abc123", allow_private=False)
    manifest.write_text(manifest.read_text() + 'headers = { "X-Api-Key" = "k-1", Accept = "text/html" }\n')
    assert cli("job", "register", str(manifest), "--project", str(project)).exit_code == 0
    user, analyst = new_token("u-s", "user", "secrets"), new_token("a-s", "analyst", "secrets")
    stored = lambda: CrawlerDownloadSetting.objects.get(job=Job.objects.get(name="guarded").id)  # noqa: E731
    with WebServer(cluster.env) as web:
        for token in (user, new_token("root", "admin")):
            shown = web.call("GET", "/api/v1/jobs/guarded", token).json()["settings"]
            assert shown["proxy"] == "http://bob:***@proxy.example.com:3128"
            assert shown["cookie"] == "sid=abc123"
            assert shown["header_values"] == {"X-Api-Key": "k-1", "Accept": "text/html"}
            assert shown["headers"] == ["Accept", "X-Api-Key"]
        seen = web.call("GET", "/api/v1/jobs/guarded", analyst).json()["settings"]
        assert seen["proxy"] == "***" and seen["cookie"] == "***" and "header_values" not in seen
        assert "s3cret" not in web.call("GET", "/api/v1/jobs/guarded", user).text

        def change(proxy_line: str) -> None:
            text = ('name = "guarded"\ntype = "none"\n[settings]\n'
                    f'{proxy_line}cookie = "sid=abc123"\nheaders = {{ "X-Api-Key" = "k-2" }}\n')
            got = web.call("POST", "/api/v1/jobs", user, json={"manifest": text})
            assert got.status_code == 200, got.text

        change('proxy = "http://bob:***@proxy.example.com:3128"\n')  # handed back unchanged: kept
        assert stored().proxy == proxy and stored().headers == {"X-Api-Key": "k-2"}
        change('proxy = "http://bob:n3w@proxy.example.com:3128"\n')  # a new one: taken
        assert stored().proxy == "http://bob:n3w@proxy.example.com:3128"
        change('proxy = "http://eve:***@proxy.example.com:3128"\n')  # not the stored one masked: as given
        assert stored().proxy == "http://eve:***@proxy.example.com:3128"
        change("")  # left out: dropped
        assert not stored().proxy
