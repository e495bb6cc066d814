"""Tokens over the API (admins only): create (the secret in that answer only), list (never a
secret), give and take projects and jobs, revoke (its sessions end); every change audited."""
from __future__ import annotations

import pytest

from common.store.control_models import ApiToken
from tests.helpers import cli, register
from tests.integration.test_web_api import new_token, web  # noqa: F401  (the module's server)


@pytest.fixture
def admin(cluster):
    assert cli("project", "create", "shop").exit_code == 0
    return new_token("root", "admin")


def call(web, method, path, token, **kw):  # noqa: F811
    return web.call(method, "/api/v1" + path, token, **kw)


def test_an_admin_creates_grants_and_revokes_a_token(web, admin, tmp_path):  # noqa: F811
    register(tmp_path, "news")  # in project default
    ids = {p["name"]: p["id"] for p in call(web, "GET", "/projects", admin).json()["projects"]}
    shop, default = ids["shop"], ids["default"]
    made = call(web, "POST", "/tokens", admin, json={"name": "ana", "role": "user", "projects": [shop * 1.0]})
    assert made.status_code == 201, made.text
    secret = made.json()["token"]
    assert made.json()["projects"] == [shop] and secret.startswith("dct_")
    assert call(web, "GET", "/projects", secret).json()["projects"][0]["name"] == "shop"
    listed = call(web, "GET", "/tokens", admin).json()["tokens"]
    assert [t["name"] for t in listed] == ["ana", "root"] and secret not in str(listed)
    again = call(web, "POST", "/tokens", admin, json={"name": "ana", "role": "user"})
    assert again.status_code == 409 and "exists" in again.json()["error"]
    unknown = call(web, "POST", "/tokens", admin, json={"name": "x", "role": "user", "projects": [99]})
    assert unknown.status_code == 404

    given = call(web, "POST", "/tokens/ana/grant", admin, json={"projects": [default], "jobs": ["news"]})
    assert given.status_code == 200
    assert given.json() == {"name": "ana", "projects": sorted([shop, default]), "jobs": ["news"]}
    taken = call(web, "POST", "/tokens/ana/grant", admin, json={"projects": [shop], "remove": True})
    assert taken.json()["projects"] == [default]
    assert call(web, "POST", "/tokens/nobody/grant", admin, json={"projects": [shop]}).status_code == 404

    # a user may not: 403, nothing changed
    assert call(web, "POST", "/tokens", secret, json={"name": "b", "role": "admin"}).status_code == 403
    assert call(web, "POST", "/tokens/root/revoke", secret).status_code == 403
    assert call(web, "GET", "/tokens", secret).status_code == 403
    assert ApiToken.objects(name="b").count() == 0

    assert call(web, "POST", "/tokens/ana/revoke", admin).json() == {"name": "ana", "revoked": True}
    assert call(web, "GET", "/jobs", secret).status_code == 401
    actions = [e["action"] for e in call(web, "GET", "/audit?action=token.revoke", admin).json()["entries"]]
    assert actions == ["token.revoke"]
    audited = {e["action"] for e in call(web, "GET", "/audit", admin).json()["entries"]}
    assert {"token.create", "token.grant", "token.ungrant", "token.revoke"} <= audited
