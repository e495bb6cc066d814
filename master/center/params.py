"""A download task's parameters, checked: a caller's request (the /v1 interface's names, which
the /api/v1 center and ``downcluster center request`` share) made into a ``Delivery``, whose
``params`` is the typed record stored as the download task's ``center`` document
(``common.store.records.DownloadTaskParams``). Each wrong parameter is answered in one line
naming it; nothing is stored here.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from common.config import settings
from common.errors import ValidationError
from common.exports.sources import (
    check_source_url,
    inline_tables,
    pairs,
    parse_task_template,
    per_table,
    text,
)
from common.exports.tabular import check_fits
from common.exports.templates import from_data, parse_template
from common.notify import check_callback
from common.store import projects
from common.store.control import Token
from common.store.records import DownloadTaskParams, Pairs
from master import access
from master.exports.service import check_exec_time

TYPES = {"csv": "csv", "excel": "xlsx", "xlsx": "xlsx"}
PARAMS = ("project_id", "name", "file_name", "type", "callback", "step", "operator_id", "merchant_type",
          "merchant_id", "template", "title", "summary", "header", "footer", "default_width",
          "default_height", "max_exec_time", "source_url", "source_data")
FILE_NAME_RE = re.compile(r"^[^/\\\"\x00-\x1f\x7f]{1,100}$")
MAX_PROJECT = 2**31 - 1


@dataclass(frozen=True)
class Delivery:
    """A download task as delivered, checked: what ``service.deliver`` stores and
    ``service.sync`` writes at once."""
    project_id: int
    format: str
    params: DownloadTaskParams
    callback: str | None = None
    max_exec_time: int | None = None
    tables: list = field(default_factory=list)   # source_data's tables, parsed


def check_project(token: Token | None, project_id: Any, what: str = "project_id") -> int:
    """A project id the token may use, as an integer: one that exists and that the token holds
    (``master.access``); any other answers 404, as a project nobody has."""
    number = integer(project_id, what, 1, MAX_PROJECT, required=True)
    access.check_project(token, number)
    return number


def private_allowed(project_id: int | None) -> bool:
    """Whether a download task of ``project_id`` may pull from private addresses: the cluster's
    SOURCE_ALLOW_PRIVATE, or the project's own ``allow_private`` (``project create --allow-private``)."""
    return bool(settings.SOURCE_ALLOW_PRIVATE) or projects.allows_private(project_id)


def integer(value: Any, what: str, low: int, high: int, required: bool = False,
            default: int | None = None) -> int:
    if value is None or value == "":
        if required:
            raise ValidationError(f"{what} is required")
        return default  # type: ignore[return-value]
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value.strip()):
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{what} must be a whole number from {low} to {high}")
    return value


def check(given: dict, token: Token | None = None) -> Delivery:
    """The download task's parameters checked (one line naming the first that is wrong)."""
    unknown = sorted(set(given) - set(PARAMS))
    if unknown:
        raise ValidationError(f"unknown parameter {unknown[0][:40]!r}")
    project_id = check_project(token, given.get("project_id"))
    name = _name(given.get("name"))
    fmt = _format(given.get("type"))
    params = DownloadTaskParams(
        name=name, file_name=_file_name(given.get("file_name")),
        step=integer(given.get("step"), "step", 100, 5000, default=1000),
        operator_id=_operator(given.get("operator_id")),
        merchant_type=integer(given.get("merchant_type"), "merchant_type", 0, 3),
        merchant_id=integer(given.get("merchant_id"), "merchant_id", 0, 2**53))
    callback = _callback(given.get("callback") or None)
    max_exec_time = check_exec_time(integer(given.get("max_exec_time"), "max_exec_time", 10,
                                            settings.EXPORT_MAX_EXEC_TIME_LIMIT))
    tables, params = _source(given.get("source_url"), given.get("source_data"), project_id, params)
    template, params = _look(given, max(1, len(tables)), params)
    _check_layout(template, params.tables, fmt)
    return Delivery(project_id, fmt, params, callback, max_exec_time, tables)


def _name(name: Any) -> str:
    if not isinstance(name, str) or not 2 <= len(name.strip()) <= 60:
        raise ValidationError("name must be 2 to 60 characters")
    return name.strip()


def _format(kind: Any) -> str:
    """The file format a ``type`` names (csv when not given)."""
    kind = kind or "csv"
    if kind not in TYPES:
        raise ValidationError(f"type must be csv or excel, got {str(kind)[:20]!r}")
    return TYPES[kind]


def _file_name(file_name: Any) -> str:
    """The given file name, checked, or a new one from the time and a random number."""
    file_name = file_name or ""
    if file_name and (not isinstance(file_name, str) or not FILE_NAME_RE.match(file_name)):
        raise ValidationError("file_name must be 1 to 100 characters without / \\ \" or control characters")
    if not file_name:
        file_name = datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S") + f"_{secrets.randbelow(10**6):06d}"
    return file_name


def _operator(operator_id: Any) -> str | None:
    if operator_id is not None and (isinstance(operator_id, bool) or not isinstance(operator_id, (str, int))
                                    or len(str(operator_id)) > 64):
        raise ValidationError("operator_id must be text of at most 64 characters")
    return None if operator_id is None else str(operator_id)


def _callback(callback: Any) -> Any:
    """The callback URL, checked (``common.notify``) and named as the parameter is."""
    if callback is not None:
        try:
            check_callback(callback)
        except ValidationError as exc:
            raise ValidationError(str(exc).replace("callback_url", "callback", 1)) from None
    return callback


def _source(source_url: Any, source_data: Any, project_id: int,
            params: DownloadTaskParams) -> tuple[list, DownloadTaskParams]:
    """Where the rows come from, kept in ``params``: source_data first, parsed into its tables;
    else source_url, checked, and no tables yet."""
    if source_data not in (None, ""):
        raw = source_data if isinstance(source_data, str) else json.dumps(source_data, ensure_ascii=False)
        if len(raw.encode()) > settings.SOURCE_DATA_MAX_BYTES:
            raise ValidationError(f"source_data is larger than SOURCE_DATA_MAX_BYTES "
                                  f"({settings.SOURCE_DATA_MAX_BYTES} bytes): give a source_url")
        tables = inline_tables(raw)
        return tables, replace(params, source_data=raw, tables=max(1, len(tables)))
    if source_url not in (None, ""):
        check_source_url(source_url, private_allowed(project_id))
        return [], replace(params, source_url=source_url)
    raise ValidationError("give source_url or source_data")


def _look(given: dict, n: int, params: DownloadTaskParams) -> tuple[Any, DownloadTaskParams]:
    """The file's look for ``n`` tables (template, title, summary, header, footer, default sizes),
    kept in ``params``; and the template as given."""
    template = parse_task_template(given.get("template"), n)
    stored = None if template is None else (
        template if isinstance(template, str) else json.dumps(template, ensure_ascii=False))

    def lines(key: str) -> tuple[Pairs | None, ...]:
        return tuple(None if p is None else tuple(tuple(x) for x in p)
                     for p in per_table(given.get(key), n, key, pairs))

    return template, replace(
        params, tables=n, template=stored, title=per_table(given.get("title"), n, "title", text),
        summary=per_table(given.get("summary"), n, "summary", text), header=lines("header"),
        footer=lines("footer"), default_width=_points(given.get("default_width"), "default_width"),
        default_height=_points(given.get("default_height"), "default_height"))


def _points(value: Any, what: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 1 <= number <= 1000:
        raise ValidationError(f"{what} must be a number of points from 1 to 1000")
    return number


def _check_layout(template: Any, n: int, fmt: str) -> None:
    """Row headers or several tables need excel."""
    if template is not None and n == 1:
        parsed = parse_template(template, general=True) if isinstance(template, str) else from_data(
            template, general=True)
        check_fits(parsed, fmt)
    elif n > 1 and fmt != "xlsx":
        raise ValidationError("multi-table mode (source_data as a list of tables) needs type excel")
