"""Running it for months: secrets kept from analysts (the control database), and what an
operator's tools read."""
from __future__ import annotations

import json

import pymongo

from common.models import ApiToken, ClusterSecret, WebSession
from master import tokens
from tests.helpers import cli

SECRET_COLLECTIONS = {"cluster_secret", "api_token", "web_session"}


def test_analysts_databases_hold_no_secret_token_digest_or_session(cluster):
    from common.signing import export_url, key

    secret = tokens.create("ann", "analyst")
    digest = tokens.digest(secret)
    cookie, csrf = tokens.start_session(ApiToken.objects.get(name="ann"))
    link = export_url("6561d2f0a1b2c3d4e5f60718", 60)
    signing_key = key("SECRET_KEY").decode()
    assert "sig=" in link and len(signing_key) == 64
    client = pymongo.MongoClient(cluster.mongo_server.uri("admin"))
    try:
        for name in ("dc_test", "dc_test_log"):  # what analysts are given
            db = client[name]
            assert not SECRET_COLLECTIONS & set(db.list_collection_names()), name
            for collection in db.list_collection_names():
                for doc in db[collection].find():
                    text = json.dumps(doc, default=str)
                    for needle in (secret, digest, tokens.digest(cookie), csrf, signing_key):
                        assert needle not in text, (name, collection)
        control = client["dc_test_control"]  # the one they are never given
        assert SECRET_COLLECTIONS <= set(control.list_collection_names())
        assert control.api_token.find_one({"digest": digest})["name"] == "ann"
    finally:
        client.close()


def test_migrate_moves_an_earlier_clusters_secrets_out_of_the_source(cluster):
    client = pymongo.MongoClient(cluster.mongo_server.uri("admin"))
    try:
        source = client["dc_test"]  # as an earlier version left them
        source.cluster_secret.insert_one({"_id": "SECRET_KEY", "value": "ab" * 32})
        source.api_token.insert_one({"name": "old", "role": "admin", "digest": "cd" * 32})
        source.web_session.insert_one({"_id": "ef" * 32, "token": "cd" * 32, "csrf": "x", "expires_at": None})
        result = cli("migrate")
        assert result.exit_code == 0, result.output
        assert "moved 3 secrets, tokens and sessions" in result.output
        assert not SECRET_COLLECTIONS & set(source.list_collection_names())
        assert ClusterSecret.objects.get(id="SECRET_KEY").value == "ab" * 32
        assert ApiToken.objects.get(name="old").digest == "cd" * 32 and WebSession.objects.count() == 1
        again = cli("migrate")
        assert again.exit_code == 0 and "moved 0 secrets" in again.output
    finally:
        client.close()
