"""Exports and who may read them: cells a spreadsheet would run are neutralised in CSV (raw in JSON
Lines, strings in Excel); an export belongs to its requesting token by id, so two tokens asking for
the same export each get their own, and a new token given a revoked one's name inherits nothing."""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
from urllib.parse import quote

import pytest

from common.config import load, settings
from common.exports.tabular import csv_cell, write_csv, write_jsonl
from common.exports.templates import parse_template
from common.store import control
from common.store.models import Export
from master.dispatch.dispatcher import dispatch_once
from master.exports import service as exports
from slave.exporter import run_export
from tests.helpers import add_urls, burst_worker, cli, register
from tests.integration.test_web_api import new_token
from tests.receivers import WebhookReceiver
from tests.web_helpers import WebServer

FORMULA = '=HYPERLINK("http://evil.example","x")'
BODY_TEMPLATE = '''
[[columns]]
header = ["URL"]
field = "url"
[[columns]]
header = ["=1+1"]
field = "body_text"
'''


def _file(export_id) -> bytes:
    from gridfs import GridFSBucket

    export = Export.objects.get(id=export_id)
    bucket = GridFSBucket(Export._get_collection().database, "export_fs")
    return bucket.open_download_stream(export.file_id).read()


def _formula_page(cluster, tmp_path) -> str:
    """Job ``j`` with one stored page whose text is FORMULA; its URL."""
    register(tmp_path, "j")
    url = f"{cluster.site}/echo?body={quote(FORMULA)}"
    add_urls("j", [url])
    assert dispatch_once(cluster.redis).total == 1
    burst_worker(cluster, "--no-exports")
    return url


# --- formula injection -----------------------------------------------------------------------

def test_csv_cell_rule():
    for raw in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", FORMULA):
        assert csv_cell(raw) == "'" + raw
    for kept in ("a=1", "", " =1", 5, -5, None, "'=1"):
        assert csv_cell(kept) == kept


def test_writers_neutralise_csv_only():
    template = parse_template(BODY_TEMPLATE)
    rows = [{"url": "http://a.example/", "body_text": FORMULA}, {"url": "-x", "body_text": "plain"}]
    out = io.BytesIO()
    assert write_csv(template, rows, out) == 2
    got = list(csv.reader(io.StringIO(out.getvalue().decode())))
    assert got == [["URL", "'=1+1"], ["http://a.example/", "'" + FORMULA], ["'-x", "plain"]]
    out = io.BytesIO()
    write_jsonl(template, rows, out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"URL": "http://a.example/", "=1+1": FORMULA}, {"URL": "-x", "=1+1": "plain"}]


def test_a_stored_formula_is_neutralised_in_csv_kept_raw_in_jsonl_and_a_string_in_xlsx(cluster, tmp_path):
    import openpyxl

    url = _formula_page(cluster, tmp_path)
    whole_csv = tmp_path / "whole.csv"
    assert cli("data", "export", "j", "--format", "csv", "-o", str(whole_csv)).exit_code == 0
    rows = list(csv.DictReader(whole_csv.open(newline="", encoding="utf-8")))
    assert len(rows) == 1 and rows[0]["body"] == "'" + FORMULA and rows[0]["url"] == url
    whole_jsonl = tmp_path / "whole.jsonl"
    assert cli("data", "export", "j", "--format", "jsonl", "-o", str(whole_jsonl)).exit_code == 0
    assert json.loads(whole_jsonl.read_text())["body_text"] == FORMULA

    ids = {fmt: str(exports.request(cluster.redis, "j", fmt, BODY_TEMPLATE).export.id)
           for fmt in ("csv", "jsonl", "xlsx")}
    for export_id in ids.values():
        assert run_export(export_id, "w1") == "success"
    got = list(csv.reader(io.StringIO(_file(ids["csv"]).decode())))
    assert got == [["URL", "'=1+1"], [url, "'" + FORMULA]]
    assert json.loads(_file(ids["jsonl"]))["=1+1"] == FORMULA
    sheet = openpyxl.load_workbook(io.BytesIO(_file(ids["xlsx"]))).active
    assert sheet["B1"].data_type == "s" and sheet["B1"].value == "=1+1"
    assert sheet["B2"].data_type == "s" and sheet["B2"].value == FORMULA  # a string, never a formula

    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        return  # LibreOffice's own reading is checked where it is installed
    # a profile of its own: a LibreOffice already running on the shared one (another test on another
    # xdist worker) would take the conversion over and this one return at once
    profile = f"-env:UserInstallation=file://{tmp_path / 'lo-profile'}"
    subprocess.run([soffice, profile, "--headless", "--convert-to", "xlsx", "--outdir", str(tmp_path),
                    str(whole_csv)], check=True, capture_output=True, timeout=120)
    converted = openpyxl.load_workbook(tmp_path / "whole.xlsx").active
    header = [c.value for c in converted[1]]
    cell = converted.cell(row=2, column=header.index("body") + 1)
    assert cell.data_type == "s" and "HYPERLINK" in str(cell.value)


# --- who owns an export ----------------------------------------------------------------------

def test_two_requesters_of_the_same_export_each_get_their_own(cluster, tmp_path):
    load(flags=dict(settings.flags, WEBHOOK_ALLOW_PRIVATE=True))
    register(tmp_path, "j")
    secrets = {name: new_token(name, "analyst") for name in ("ann", "bob")}
    owners = {name: control.token(name) for name in secrets}
    with WebhookReceiver() as ann_hook, WebhookReceiver() as bob_hook:
        hooks = {"ann": ann_hook, "bob": bob_hook}
        got = {name: exports.request(cluster.redis, "j", "csv", callback_url=hooks[name].url,
                                     requested_by=name, owner=owners[name].id) for name in secrets}
        assert not got["ann"].deduplicated and not got["bob"].deduplicated
        assert got["ann"].export.id != got["bob"].export.id
        again = exports.request(cluster.redis, "j", "csv", requested_by="ann", owner=owners["ann"].id)
        assert again.deduplicated and again.export.id == got["ann"].export.id  # the same token joins
        assert not exports.request(cluster.redis, "j", "csv", requested_by="cli").deduplicated  # no one else
        for name in secrets:
            assert run_export(str(got[name].export.id), "w1") == "success"
        for name, hook in hooks.items():
            assert len(hook.received) == 1
            payload = json.loads(hook.received[0][1])
            assert payload["id"] == str(got[name].export.id) and f"/{got[name].export.id}" in payload["url"]
    with WebServer(cluster.env) as web:
        ann_id, bob_id = str(got["ann"].export.id), str(got["bob"].export.id)
        for path in (f"/api/v1/exports/{bob_id}", f"/api/v1/exports/{bob_id}/file",
                     f"/api/v1/exports/{bob_id}/link"):
            assert web.call("GET", path, secrets["ann"]).status_code == 404, path
        assert web.call("POST", f"/api/v1/exports/{bob_id}/cancel", secrets["ann"]).status_code == 404
        assert web.call("GET", f"/api/v1/exports/{ann_id}/file", secrets["ann"]).status_code == 200
        listed = {e["id"] for e in web.call("GET", "/api/v1/exports", secrets["ann"]).json()["exports"]}
        assert listed == {ann_id}
        # through the API as well: two tokens, two exports
        asked = {"job": "j", "format": "jsonl"}
        first = web.call("POST", "/api/v1/exports", secrets["ann"], json=asked).json()
        second = web.call("POST", "/api/v1/exports", secrets["bob"], json=asked).json()
        assert first["id"] != second["id"] and not second["deduplicated"]


def test_a_new_token_under_a_revoked_name_inherits_no_export_and_no_grant(cluster, tmp_path):
    register(tmp_path, "j")
    old_secret = new_token("ann", "analyst")
    assert cli("token", "grant", "ann", "j").exit_code == 0
    old = control.token("ann")
    export_id = str(exports.request(cluster.redis, "j", "csv", requested_by="ann", owner=old.id).export.id)
    # an export stored before exports had owners: named by requested_by only
    legacy = exports.request(cluster.redis, "j", "jsonl", requested_by="ann").export
    Export._get_collection().update_one({"_id": legacy.id}, {"$unset": {"owner": 1}})
    assert exports.may_see(old, Export.objects.get(id=legacy.id))
    assert cli("token", "revoke", "ann").exit_code == 0
    new_secret = new_token("ann", "analyst")
    new = control.token("ann")
    assert new.id != old.id and new.jobs == []
    for seen in (export_id, str(legacy.id)):
        with pytest.raises(Exception) as caught:
            exports.get(seen, new)
        assert type(caught.value).__name__ == "NotFound"
    assert exports.listing(token=new) == []
    with WebServer(cluster.env) as web:
        assert web.call("GET", f"/api/v1/exports/{export_id}", old_secret).status_code == 401
        for path in (f"/api/v1/exports/{export_id}", f"/api/v1/exports/{legacy.id}"):
            assert web.call("GET", path, new_secret).status_code == 404
        assert web.call("GET", "/api/v1/exports", new_secret).json()["exports"] == []
    # the upgrade names owners only where the live token is not younger than the export
    mine = exports.request(cluster.redis, "j", "xlsx", requested_by="ann").export
    Export._get_collection().update_one({"_id": mine.id}, {"$unset": {"owner": 1}})
    assert exports.may_see(new, Export.objects.get(id=mine.id))  # lazily, before the upgrade
    assert cli("migrate").exit_code == 0
    assert Export.objects.get(id=mine.id).owner == new.id
    assert Export.objects.get(id=legacy.id).owner is None
    assert {str(e.id) for e in exports.listing(token=new)} == {str(mine.id)}
    # "cli" names the command line's exports: no token takes that name
    refused = cli("token", "create", "cli", "--role", "analyst")
    assert refused.exit_code != 0 and "reserved" in refused.output
