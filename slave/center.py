"""One attempt of a download task of the general download center on a worker: its rows from
``source_data`` or pulled from ``source_url`` page by page (``common/exports/sources.py``),
streamed into the export writers and up to GridFS as they come. Claimed, beaten, fenced and
settled by the export protocol (``slave/exporter.py``): a download task is an export whose rows
come from its caller, so a failure here removes the partial file and nothing is published.
"""
from __future__ import annotations

from typing import IO, TYPE_CHECKING, Callable, Iterator, cast

from common.config import settings
from common.exports.events import publish
from common.exports.sources import (
    Puller,
    inline_tables,
    look_of,
    pull,
    pull_options,
    write_inline,
    write_pulled,
)
from common.exports.tabular import CONTENT_TYPES
from common.store import exports, projects
from common.store.data import Upload, export_upload
from common.store.records import DownloadTaskParams, ExportRecord

if TYPE_CHECKING:
    from bson import ObjectId


def file_name(export: ExportRecord, params: DownloadTaskParams) -> str:
    return f"{params.file_name or export.id}.{export.format}"


RowWrap = Callable[[Iterator[dict]], Iterator[dict]]


def write_download_task(export: ExportRecord, file_id: ObjectId, wrap: RowWrap,
                        worker_id: str) -> tuple[int, Upload]:
    """Write the download task's file; (rows, the closed-over upload, still open) — the caller
    checks it is still its own before closing the upload, which publishes the file."""
    params = export.center
    assert params is not None, "a download task has its parameters"
    meta = {"export": export.id, "project_id": export.project, "contentType": CONTENT_TYPES[export.format]}
    upload = export_upload(file_id, file_name(export, params), meta)
    out = cast(IO[bytes], upload)
    look = look_of(params)
    if params.source_data is not None:
        tables = inline_tables(params.source_data)
        exports.set_total(export.id, worker_id, sum(len(t) for t in tables if isinstance(t, list)))
        publish(export.id)
        _, rows = write_inline(look, tables, export.format, out, wrap)
        return rows, upload
    allow = bool(settings.SOURCE_ALLOW_PRIVATE) or projects.allows_private(export.project)
    with Puller(params.source_url or "", params.step or 1000, str(export.id), allow,
                **pull_options(params)) as puller:
        pulled = pull(puller, look)
        if pulled.total is not None:
            exports.set_total(export.id, worker_id, pulled.total)
            publish(export.id)
        rows = write_pulled(pulled, export.format, out, wrap)
    return rows, upload
