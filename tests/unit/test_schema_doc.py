"""The schema table of docs/schema.md is the truth: the collections and fields it lists are exactly what
the models declare, and every field a real run stores (``make demo``, read back in
tests/e2e/test_make_commands.py with ``stored_fields``) is listed."""
from __future__ import annotations

import pymongo

from common.store.schema import ALL_MODELS
from tests.schema_doc import documented

GRIDFS_SUFFIXES = (".files", ".chunks")  # GridFS buckets, described in prose beside their documents


def declared() -> dict[str, dict[str, set[str]]]:
    out: dict[str, dict[str, set[str]]] = {"source": {}, "log": {}, "control": {}}
    for model in ALL_MODELS:
        out[model._meta["db_alias"]][model._get_collection_name()] = {
            f.db_field for f in model._fields.values()
        } - {"_id"}
    return out


def test_readme_lists_exactly_the_collections_and_fields_the_models_declare():
    doc, models = documented(), declared()
    differences = []
    for db in models:
        for name in sorted(set(doc[db]) | set(models[db])):
            if name not in doc[db]:
                differences.append(f"{db}.{name}: not in docs/schema.md")
            elif name not in models[db]:
                differences.append(f"{db}.{name}: in docs/schema.md, no model")
            else:
                listed, have = doc[db][name] - {"_id"}, models[db][name]
                if listed != have:
                    differences.append(
                        f"{db}.{name}: docs only {sorted(listed - have)}, model only {sorted(have - listed)}"
                    )
    assert differences == []


def stored_fields(client: pymongo.MongoClient, names: dict[str, str]) -> list[str]:
    """Differences between what the databases ``names`` ({"source": db name, ...}) hold and the
    README: a collection it does not list, or a stored top-level field it does not list."""
    doc, differences = documented(), []
    for db, name in names.items():
        database = client[name]
        for collection in database.list_collection_names():
            if collection.endswith(GRIDFS_SUFFIXES):
                continue
            if collection not in doc[db]:
                differences.append(f"{db}.{collection}: stored, not in docs/schema.md")
                continue
            seen: set[str] = set()
            for row in database[collection].find({}, limit=5000):
                seen |= set(row)
            extra = seen - doc[db][collection] - {"_id"}
            if extra:
                differences.append(f"{db}.{collection}: stored fields not in docs/schema.md: {sorted(extra)}")
    return differences


def test_every_departure_from_seed_003s_models_is_stated_with_its_reason():
    """Seed 003 declares integer statuses, ``crawler_generator`` for the task, headers and bodies as
    strings, ``Job.hostname`` and a dispatcher process pool; where the code departs, docs/schema.md
    says so (and why) in its own section."""
    import inspect

    from mongoengine import BinaryField, DictField, StringField

    from common.store.log_models import CrawlerDownloadLog
    from common.store.models import CrawlerDownload, CrawlerDownloadData, CrawlerTask, Job
    from master.dispatch import dispatcher
    from tests.schema_doc import SCHEMA

    text = SCHEMA.read_text(encoding="utf-8")
    head = "## Where this departs from seed 003"
    assert head in text
    section = text.split(head, 1)[1].split("\n## ", 1)[0].split("**source**", 1)[0]
    data, statused = CrawlerDownloadData._fields, (CrawlerDownload, CrawlerDownloadLog, CrawlerTask, Job)
    job_stored = {f.db_field for f in Job._fields.values()}  # stored names (the code says worker_host)
    departures = {
        "**Statuses are words, not integers.**":
            all(isinstance(m._fields["status"], StringField) for m in statused),
        "**`task`, not `crawler_generator`.**": "task" in data and "crawler_generator" not in data,
        "**Headers are objects, bodies bytes.**": isinstance(data["response_headers"], DictField)
        and isinstance(data["response_body"], BinaryField),
        "**`host`, not `hostname`, on a job.**": "host" in job_stored and "hostname" not in job_stored,
        "**The dispatcher uses threads, not a process pool.**":
            "ThreadPoolExecutor" in inspect.getsource(dispatcher),
    }
    for statement, departs in departures.items():
        assert departs, f"the code no longer departs: drop {statement} from {head}"
        assert statement in section, f"{head} does not state {statement}"
        reason = section.split(statement, 1)[1].split("\n- ", 1)[0]
        assert len(reason.split()) > 20, f"{statement}: no reason given"
