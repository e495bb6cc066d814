"""What ``downcluster migrate`` moves between databases: the cluster's secrets, token digests
and console sessions (``cluster_secret``, ``api_token``, ``web_session``) out of the source
database, which analysts read, into the control database (``MONGO_CONTROL_URI``); and the
indexes an earlier version made that this one no longer keeps (``retire_indexes``), with what
replaces them (the keys of tasks stored before ``crawler_task_key``).

No index of its own: documents are read whole and written by ``_id`` (the target collections'
indexes are the models').

Invariant: a document is written to the control database before it is removed from the source,
so a run cut short loses nothing and a second run finishes the move.
"""
from __future__ import annotations

from pymongo.errors import DuplicateKeyError

from common.store.control_models import ApiToken, ClusterSecret, WebSession
from common.store.models import CrawlerDownloadData, CrawlerTask, Job


def move_secrets() -> tuple[int, list[str]]:
    """Move cluster_secret, api_token and web_session documents from the source database to the
    control database: written there first (same _id), then removed from the source."""
    source = CrawlerTask._get_collection().database
    moved, kept = 0, []
    for model in (ClusterSecret, ApiToken, WebSession):
        target = model._get_collection()
        if target.database.name == source.name and target.database.client is source.client:
            continue  # MONGO_CONTROL_URI names the source database itself: nothing to move
        old = source[target.name]
        for doc in old.find():
            try:
                target.replace_one({"_id": doc["_id"]}, doc, upsert=True)
            except DuplicateKeyError:  # a token of that name already lives in the control database
                kept.append(f"{target.name} {doc.get('name', doc['_id'])}")
                continue
            old.delete_one({"_id": doc["_id"]})
            moved += 1
        if not old.estimated_document_count():
            old.drop()
    return moved, kept


# indexes of earlier versions, dropped by ``migrate``: each costs every write of its collection
RETIRED_INDEXES = (
    (CrawlerDownloadData, [("task", 1), ("lease", 1)]),  # the unique (task, version) finds them
    (CrawlerTask, [("job", 1), ("uri", 1)]),  # a URL once per job: its key (crawler_task_key)
)


def retired_left() -> list[str]:
    """The RETIRED_INDEXES the store still has, as "collection (fields)": until ``migrate`` drops
    them, this version runs on a store it has not finished upgrading (and says so)."""
    left = []
    for model, keys in RETIRED_INDEXES:
        coll = model._get_collection()
        if any(list(ix["key"].items()) == keys for ix in coll.list_indexes()):
            left.append(f"{coll.name} ({', '.join(k for k, _ in keys)})")
    return left


def retire_indexes() -> tuple[int, int]:
    """Drop the RETIRED_INDEXES a store still has, then make the indexes this version keeps: data
    written before one document per page version was kept may hold a lost attempt's document
    beside its task's (until the orphan sweep): such documents, named by no task, go first
    (``common.store.orphans.drop_orphans_of_versions``); tasks stored before their URLs had keys
    get them first (``common.store.tasks.build_keys``, in batches), while the unique (job, uri)
    still holds their URLs unique. Returns (indexes dropped, keys made)."""
    from common.store.orphans import drop_orphans_of_versions
    from common.store.tasks import build_keys

    made = 0
    if "crawler_task (job, uri)" in retired_left():
        for job in Job._get_collection().find({}, {"_id": 1}):
            made += build_keys(job["_id"])
    dropped = 0
    for model, fields in RETIRED_INDEXES:
        coll = model._get_collection()
        for ix in coll.list_indexes():
            if list(ix["key"].items()) == fields:
                coll.drop_index(ix["name"])
                dropped += 1
    drop_orphans_of_versions()
    CrawlerDownloadData.ensure_indexes()
    return dropped, made
