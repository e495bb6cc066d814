"""Hostile input is a 4xx (or exit 2) with one line, never a 500 or a traceback: signed links
whose signature or expiry hold non-ASCII characters, and manifests and JSON bodies nested 50,000
deep, templates as deep as their size cap allows (a 50,000-deep one is refused for its size).
Through a real ``downcluster web`` and the CLI; nothing is stored."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
import requests

from common.store.log_models import CrawlerRegistrationErrorLog
from common.store.models import Export, Job
from services import env_for
from tests.helpers import cli, register
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

DEEP = 50_000
DEEP_TOML = (
    'name = "deep"\npriority = 5\ntype = "none"\n[settings]\nheaders = ' + "[" * DEEP + "]" * DEEP + "\n"
)
DEEP_TOML_TABLES = "name = \"deep\"\nx = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n"
TEMPLATE_DEEP = 30_000  # templates are capped at 65,536 characters; still 30 times the recursion limit
DEEP_JSON_TEMPLATE = '{"col": ' + "[" * TEMPLATE_DEEP + "]" * TEMPLATE_DEEP + "}"


@pytest.fixture(scope="module")
def web(redis_server, mongo_server):
    env = env_for(
        redis_server.url,
        mongo_server.uri("dc_test"),
        mongo_server.uri("dc_test_log"),
        HOSTNAME="testhost",
        API_MAX_BODY=4 * 1024 * 1024,
    )
    with WebServer(env) as server:
        yield server


def _one_line(resp: requests.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:300]
    error = resp.json()["error"]
    assert isinstance(error, str) and "\n" not in error and "Traceback" not in error
    return error


@pytest.mark.parametrize("sig", ["é" * 64, "0" * 63 + "ü", "\u0661" * 64, "%00" * 10])
def test_a_signed_link_with_a_non_ascii_signature_is_403(cluster, web, sig):
    from bson import ObjectId

    url = f"/files/exports/{ObjectId()}?expires=9999999999&sig={quote(sig)}"
    assert "signature does not match" in _one_line(web.call("GET", url), 403)


@pytest.mark.parametrize("expires", ["²", "\u0663\u0663", "１２"])  # str.isdigit() says yes to these
def test_a_signed_link_with_non_ascii_digits_in_its_expiry_is_403(cluster, web, expires):
    from bson import ObjectId

    url = f"/files/exports/{ObjectId()}?expires={quote(expires)}&sig={'0' * 64}"
    assert "signature does not match" in _one_line(web.call("GET", url), 403)


@pytest.mark.parametrize("manifest", [DEEP_TOML, DEEP_TOML_TABLES])
def test_a_manifest_nested_50000_deep_is_refused_through_the_api_and_the_cli(
    cluster, web, tmp_path, manifest
):
    admin = new_token("root", "admin")
    why = _one_line(web.call("POST", "/api/v1/jobs", admin, json={"manifest": manifest}), 422)
    assert "nests arrays or tables too deeply" in why
    path = tmp_path / "deep.toml"
    path.write_text(manifest)
    result = cli("job", "register", str(path))
    assert result.exit_code == 2 and "nests arrays or tables too deeply" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert Job.objects.count() == 0
    assert CrawlerRegistrationErrorLog.objects.count() == 2  # each refusal logged, nothing else stored


def test_a_json_body_nested_50000_deep_is_a_4xx(cluster, web):
    admin = new_token("root", "admin")
    body = '{"manifest": "name = \\"x\\"", "code": ' + "[" * DEEP + "]" * DEEP + "}"
    resp = web.call("POST", "/api/v1/jobs", admin, data=body, headers={"Content-Type": "application/json"})
    assert 400 <= resp.status_code < 500
    _one_line(resp, resp.status_code)
    assert Job.objects.count() == 0


@pytest.mark.parametrize("template", [DEEP_JSON_TEMPLATE, "x = " + "[" * TEMPLATE_DEEP + "]" * TEMPLATE_DEEP])
def test_a_template_nested_30000_deep_is_refused_through_the_api_and_the_cli(
    cluster, web, tmp_path, template
):
    register(tmp_path, "j")
    analyst = new_token("ann", "analyst")
    why = _one_line(web.call("POST", "/api/v1/exports", analyst, json={"job": "j", "format": "csv",
                                                                         "template": template}), 422)
    assert "template nests too deeply" in why
    path = tmp_path / "deep-template.txt"
    path.write_text(template)
    for args in (
        ["export", "request", "j", "--format", "csv", "--template", str(path)],
        ["data", "export", "j", "--format", "csv", "--template", str(path), "-o", str(tmp_path / "out.csv")],
    ):
        result = cli(*args)
        assert result.exit_code == 2 and "template nests too deeply" in result.output, args
        assert len(result.output.strip().splitlines()) == 1
    assert Export.objects.count() == 0 and not (tmp_path / "out.csv").exists()
    assert json.loads(web.call("GET", "/api/v1/exports", analyst).text)["exports"] == []
