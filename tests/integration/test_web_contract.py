"""The API keeps the contract it publishes, checked by the tools its users run: the description
validates as OpenAPI 3.1 (openapi-spec-validator), schemathesis with every check finds nothing as
an admin or as an analyst, a client generated from it (openapi-python-client) does a whole round,
and methods behave as RFC 9110 says."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.helpers import add_urls, cli, register
from tests.web_helpers import WebServer

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parents[1]  # tests/, where schemathesis.toml is


@pytest.fixture(scope="module")
def web(redis_server, mongo_server):
    from services import env_for

    env = env_for(
        redis_server.url, mongo_server.uri("dc_test"), mongo_server.uri("dc_test_log"), HOSTNAME="testhost"
    )
    with WebServer(env, API_MAX_LIMIT=50, WEBHOOK_ALLOW_PRIVATE="1") as server:
        yield server


def token(name: str, role: str) -> str:
    held = () if role == "admin" else ("--project", "default")  # where jobs without a project go
    result = cli("token", "create", name, "--role", role, *held)
    assert result.exit_code == 0, result.output
    return result.stdout.strip().splitlines()[-1]


def burst(cluster) -> None:
    worker = subprocess.run([str(BIN / "downcluster"), "worker", "--burst"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, **cluster.env})
    assert worker.returncode == 0, worker.stderr[-2000:]


def test_the_description_is_openapi_3_1_with_security_ids_errors_and_examples(cluster, web):
    from openapi_spec_validator import validate

    spec = requests.get(web.base + "/api/v1/openapi.json", timeout=10).json()
    validate(spec)  # raises on any departure from OpenAPI 3.1
    assert spec["openapi"].startswith("3.1")
    assert spec["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": "a token from `downcluster token create`"}
    ids = []
    for path, item in spec["paths"].items():
        for method, op in item.items():
            ids.append(op["operationId"])
            assert op["operationId"].isidentifier() and op["tags"], (method, path)
            errors = {code: r for code, r in op["responses"].items() if code >= "400"}
            assert {"413", "422", "503"} <= set(errors), (method, path)
            for answer in errors.values():
                assert answer["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorOut"
                }
            if op["operationId"] not in ("sign_in", "sign_out", "export_file"):  # the rest take a token
                assert op["security"] == [{"bearer": []}, {"session": []}] and "401" in errors, (method, path)
            body = op.get("requestBody", {}).get("content", {})
            for media in body.values():
                schema = media["schema"]
                if "$ref" in schema:
                    schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
                assert media.get("example") or schema.get("examples"), (method, path)
    # 46, the tokens (4), the callers (add, list, remove, keys), a job's dry run (ask, show)
    assert len(ids) == len(set(ids)) == 56
    tasks = spec["paths"]["/api/v1/jobs/{name}/tasks"]["get"]["parameters"]
    by_name = {p["name"]: p["schema"] for p in tasks}
    assert by_name["name"]["pattern"] and by_name["limit"]["anyOf"][0]["minimum"] == 1
    assert by_name["after"]["anyOf"][0]["pattern"] == "^[0-9a-fA-F]{24}$"
    assert set(by_name["status"]["anyOf"][0]["enum"]) == {
        "LIVE",
        "DISPATCH",
        "SUCCESS",
        "FAIL",
        "CANCEL",
        "DEAD",
    }


def test_methods_as_rfc_9110_says(cluster, web):
    analyst = token("ann", "analyst")
    r = requests.request("TRACE", web.base + "/api/v1/jobs", timeout=10)
    assert (
        r.status_code == 405
        and r.headers["allow"] == "GET, HEAD, OPTIONS, POST"
        and set(r.json()) == {"error"}
    )
    r = requests.delete(web.base + "/api/v1/exports/6561d2f0a1b2c3d4e5f60718", timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD, OPTIONS"
    r = requests.options(web.base + "/api/v1/jobs/x/tasks", timeout=10)
    assert r.status_code == 204 and r.headers["allow"] == "GET, HEAD, OPTIONS, POST" and not r.content
    got = requests.get(web.base + "/api/v1/jobs", headers={"Authorization": f"Bearer {analyst}"}, timeout=10)
    head = requests.head(
        web.base + "/api/v1/jobs", headers={"Authorization": f"Bearer {analyst}"}, timeout=10
    )
    assert head.status_code == got.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]
    r = requests.get(web.base + "/api/v1/jobs", timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = requests.get(web.base + "/api/v1/jobs", headers={"Authorization": "Bearer nope"}, timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def _seed(cluster, tmp_path) -> dict:
    """A job with data (downloaded by a real worker from the sample site) and an export."""
    register(tmp_path, "news")
    add_urls("news", [f"{cluster.site}/page/{i}" for i in range(3)])
    assert cli("dispatch").exit_code == 0
    burst(cluster)
    from common.store.models import CrawlerDownloadData
    from master.exports.service import request

    data_id = str(CrawlerDownloadData.objects.first().id)
    export_id = str(request(cluster.redis, "news", "csv", "", None, None, []).export.id)
    return {"data_id": data_id, "export_id": export_id}


def _config(tmp_path: Path, ids: dict) -> Path:
    """tests/schemathesis.toml, with the seeded ids for the operations that read one thing."""
    fixed = [("GET /api/v1/data/{data_id}/body", "data_id", ids["data_id"]),
             ("GET /api/v1/exports/{export_id}", "export_id", ids["export_id"]),
             ("POST /api/v1/exports/{export_id}/cancel", "export_id", ids["export_id"])]
    text = (HERE / "schemathesis.toml").read_text()
    for name, param, value in fixed:
        text += f'\n[[operations]]\ninclude-name = "{name}"\nparameters = {{ {param} = "{value}" }}\n'
    path = tmp_path / "schemathesis.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_schemathesis_with_every_check_finds_nothing(cluster, web, tmp_path):
    config = _config(tmp_path, _seed(cluster, tmp_path))
    for role in ("admin", "analyst"):
        secret = token(f"st-{role}", role)
        run = subprocess.run(
            [
                str(BIN / "schemathesis"),
                "--config-file",
                str(config),
                "run",
                web.base + "/api/v1/openapi.json",
                "--checks",
                "all",
                "--header",
                f"Authorization: Bearer {secret}",
                "--max-examples",
                "15",
                "--seed",
                "20261124",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )  # its cache stays out of the checkout
        summary = run.stdout[run.stdout.rfind("SUMMARY"):]
        assert run.returncode == 0, f"as {role}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
        assert "Failures" not in summary and "passed" in summary, summary
    web.__exit__()  # the server's log, whole: no traceback anywhere
    web.__enter__()
    assert "Traceback" not in web.output, web.output[-4000:]


@pytest.mark.slow
def test_a_generated_client_does_a_whole_round(cluster, web, tmp_path):
    """openapi-python-client turns the description into a typed package; that package registers a
    job, adds tasks, dispatches, reads data and a body, and requests an export."""
    spec = tmp_path / "openapi.json"
    spec.write_bytes(requests.get(web.base + "/api/v1/openapi.json", timeout=10).content)
    (tmp_path / "gen.yaml").write_text("project_name_override: dcclient\npackage_name_override: dcclient\n"
                                       "post_hooks: []\n")
    made = subprocess.run(
        [
            str(BIN / "openapi-python-client"),
            "generate",
            "--path",
            str(spec),
            "--meta",
            "none",
            "--output-path",
            str(tmp_path / "dcclient"),
            "--config",
            str(tmp_path / "gen.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (tmp_path / "dcclient" / "client.py").exists(), made.stdout[-3000:] + made.stderr[-3000:]
    sys.path.insert(0, str(tmp_path))
    try:
        client_mod = importlib.import_module("dcclient")
        for name in ("jobs.register_job", "jobs.show_job", "tasks.add_job_tasks", "tasks.list_tasks",
                     "cluster.dispatch", "data.list_data", "data.get_body", "exports.request_export",
                     "exports.show_export"):
            importlib.import_module(f"dcclient.api.{name}")
        models = importlib.import_module("dcclient.models")
        api = sys.modules["dcclient.api"]
        client = client_mod.AuthenticatedClient(base_url=web.base, token=token("gen", "admin"))

        got = api.jobs.register_job.sync_detailed(client=client, body=models.JobIn(
            manifest='name = "gen"\npriority = 2\ntype = "none"\n[settings]\nallow_private = true\n'))
        assert got.status_code == 201 and got.parsed["name"] == "gen"
        missing = api.jobs.show_job.sync_detailed("nope", client=client)
        assert missing.status_code == 404 and isinstance(missing.parsed, models.ErrorOut)
        added = api.tasks.add_job_tasks.sync(
            "gen",
            client=client,
            body=models.AddJobTasksJsonUrlsIn(urls=[f"{cluster.site}/page/{i}" for i in range(4)]),
        )
        assert added["added"] == 4
        assert api.cluster.dispatch.sync(client=client)["total"] == 4
        burst(cluster)
        status = models.ListTasksStatusType0("SUCCESS")
        assert len(api.tasks.list_tasks.sync("gen", client=client, status=status)["tasks"]) == 4
        data = api.data.list_data.sync("gen", client=client, limit=2)
        assert len(data["data"]) == 2 and data["next"]
        body = api.data.get_body.sync_detailed(data["data"][0]["id"], client=client)
        assert body.status_code == 200 and body.content.startswith(b"<html")
        export = api.exports.request_export.sync(client=client, body=models.ExportIn(
            job="gen", format_=models.ExportInFormat.JSONL))
        assert export["state"] == "PENDING"
        shown = api.exports.show_export.sync(export["id"], client=client)
        assert shown["id"] == export["id"] and shown["job"] == "gen"
    finally:
        sys.path.remove(str(tmp_path))
        for mod in [m for m in sys.modules if m == "dcclient" or m.startswith("dcclient.")]:
            del sys.modules[mod]
