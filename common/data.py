"""Removing stored data of attempts that did not settle, GridFS files included (shared by the
writer, which cleans up after itself, and the defender, which cleans up after dead workers)."""
from __future__ import annotations

import gridfs

from common.models import CrawlerDownloadData, CrawlerTask

GRIDFS_BUCKET = "crawler_download_data_fs"


def gridfs_of(database) -> gridfs.GridFS:
    return gridfs.GridFS(database, collection=GRIDFS_BUCKET)


def drop_unsettled(lease: str, ids: list) -> int:
    """Delete data that ``lease`` stored for tasks among ``ids`` it did not settle (their
    ``data_lease`` is not ``lease``). Safe to call once no attempt under ``lease`` can settle."""
    if not ids:
        return 0
    data = CrawlerDownloadData._get_collection()
    settled = {d["_id"] for d in CrawlerTask._get_collection().find(
        {"_id": {"$in": ids}, "data_lease": lease}, {"_id": 1})}
    orphans = [i for i in ids if i not in settled]
    if not orphans:
        return 0
    flt = {"task": {"$in": orphans}, "lease": lease}
    fs = None
    for doc in data.find({**flt, "response_body_gridfs": {"$ne": None}}, {"response_body_gridfs": 1}):
        fs = fs or gridfs_of(data.database)
        fs.delete(doc["response_body_gridfs"])
    return data.delete_many(flt).deleted_count
