"""``GET /files/exports/{id}?expires=UNIX&sig=HEX``: an export's file through a signed link,
without a token (the link is the credential; it names one file and ends at ``expires``)."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from gridfs.errors import NoFile

from common.exports.tabular import CONTENT_TYPES, file_name
from common.signing import check_export_sig
from common.store import exports
from common.store.models import SUCCESS
from common.store.records import ExportRecord
from master.center.service import disposition
from master.center.service import file_name as center_file_name
from master.exports.service import get
from master.web.contract import ObjectIdPath, answers
from master.web.errors import ApiError

router = APIRouter(tags=["exports"])


@router.get(
    "/files/exports/{export_id}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the export's file"},
        **answers(
            403,
            404,
            409,
            410,
            why={403: "the link's signature does not match", 409: "the export is not finished"},
        ),
    },
    openapi_extra={"security": []},
)
def export_file(
    export_id: ObjectIdPath,
    expires: Annotated[str, Query(max_length=32, description="UNIX time the link ends")],
    sig: Annotated[
        str, Query(max_length=256, description="the link's signature (a link changed in any way is a 403)")
    ],
) -> StreamingResponse:
    problem = check_export_sig(export_id, expires, sig)
    if problem == "tampered":
        raise ApiError(403, "the link's signature does not match")
    if problem == "expired":
        raise ApiError(410, "the link has expired: ask for a new one")
    return stream_file(get(export_id))


def stream_file(export: ExportRecord) -> StreamingResponse:
    """A finished export's file from GridFS, streamed 256 KiB at a time."""
    if export.state != SUCCESS:
        raise ApiError(410 if export.state in ("EXPIRED", "CANCEL") else 409, f"the export is {export.state}")
    try:
        stored = exports.open_file(export.file_id)
    except NoFile:
        raise ApiError(410, "the export's file is gone") from None
    name = center_file_name(export) or file_name(f"{export.job_name}-{export.id}", export.format)
    return StreamingResponse(
        iter(lambda: stored.read(256 * 1024), b""),
        media_type=CONTENT_TYPES[export.format],
        headers={
            "Content-Length": str(stored.length),
            "Cache-Control": "private, no-store",
            "Content-Disposition": disposition(name),
        },
    )
