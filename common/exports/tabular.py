"""Export files: CSV and JSON Lines writers that stream into a binary file object with bounded
memory, whatever the row count, and the Excel writer (``common/exports/sheets.py``). Templates are
``common/exports/templates.py``; CSV and JSON Lines take one table of columns (its leaves, by their
titles), Excel takes everything a template can say.
"""
from __future__ import annotations

import csv
import io
import json
import unicodedata
from typing import IO, Any, Callable, Iterable

from common.errors import ValidationError
from common.exports.sheets import cell_text, write_xlsx
from common.exports.templates import Table, Template
from common.store.clock import iso
from common.store.data import WholeDocuments

# What a spreadsheet reads as the start of a formula (OWASP's CSV-injection advice): such a cell
# gets a leading single quote in CSV, so Excel and LibreOffice show it as text. JSON Lines keeps the
# raw value; Excel cells are written as strings (``sheets.py``), never as formulas.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _unseen(ch: str) -> bool:
    """A character a spreadsheet may skip before it looks for a formula: controls (C0 with NUL,
    DEL, C1) and format characters (BOM, zero-width, word joiner, bidi marks, soft hyphen).
    Spaces are not: LibreOffice reads `` =1`` (and no-break or ideographic spaces) as text."""
    return unicodedata.category(ch) in ("Cc", "Cf")


def csv_cell(value: Any) -> Any:
    """A CSV cell that no spreadsheet runs: a string beginning like a formula, once the characters a
    spreadsheet skips are passed over (``\\x00=HYPERLINK(...)``), gets a leading ``'``; the text is
    kept whole."""
    if not isinstance(value, str) or not value:
        return value
    if value.startswith(FORMULA_STARTS):
        return "'" + value
    if value[0].isprintable():  # nothing to pass over (most cells: one look)
        return value
    lead = next((i for i, ch in enumerate(value) if not _unseen(ch)), len(value))
    return "'" + value if value.startswith(FORMULA_STARTS, lead) else value


def csv_row(values: Iterable[Any]) -> list[Any]:
    """A CSV row of ``csv_cell`` cells: every CSV writer of the cluster writes its rows through it."""
    return [csv_cell(v) for v in values]


def check_fits(template: Template, fmt: str) -> None:
    """Row headers and several tables need a spreadsheet."""
    if fmt == "warc":
        return  # whole documents: a template says nothing to it (an explicit one is refused at request)
    if fmt != "xlsx" and not template.plain:
        raise ValidationError(f"template: row headers and several tables need format xlsx, not {fmt}")


def _rows(source: Iterable[dict] | Callable[[Table], Any], template: Template) -> Iterable[dict]:
    return source(template.tables[0]) if callable(source) else source


def write_csv(template: Template, source: Iterable[dict] | Callable[[Table], Any], out: IO[bytes]) -> int:
    """One header row (the column titles), then a row per record; cells capped as in Excel and
    neutralised where a spreadsheet would run them (``csv_cell``)."""
    check_fits(template, "csv")
    buf = io.StringIO()
    writer = csv.writer(buf)

    def flush() -> None:
        out.write(buf.getvalue().encode("utf-8"))
        buf.seek(0)
        buf.truncate()

    columns = template.columns
    writer.writerow(csv_row(c.title for c in columns))
    n = 0
    for row in _rows(source, template):
        writer.writerow(csv_row(iso(cell_text(row.get(c.name))) for c in columns))
        n += 1
        if buf.tell() >= 256 * 1024:
            flush()
    flush()
    return n


def write_jsonl(template: Template, source: Iterable[dict] | Callable[[Table], Any], out: IO[bytes]) -> int:
    """A JSON object a line, keyed by the column titles (response headers stay an object)."""
    check_fits(template, "jsonl")
    columns, n = template.columns, 0
    for row in _rows(source, template):
        record = {c.title: iso(row.get(c.name)) for c in columns}
        out.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        n += 1
    return n


def write_warc(template: Template, source: Any, out: IO[bytes]) -> int:
    """The job's stored downloads as WARC 1.1 records (``common.exports.warc``): the template has
    no say; ``source`` is the export's ``WholeDocuments``."""
    from common.exports import warc
    from common.store.jobs import name_of

    if not isinstance(source, WholeDocuments):
        raise TypeError("a WARC file is written from whole documents")
    return warc.write_job(source.job_id, name_of(source.job_id), source.filter, out, source.wrap)


WRITERS = {"csv": write_csv, "jsonl": write_jsonl, "xlsx": write_xlsx, "warc": write_warc}
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson",
                 "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
                 "warc": "application/warc"}
EXTENSIONS = {"warc": "warc.gz"}  # a file's name ends so (else: the format's name)


def file_name(stem: str, fmt: str) -> str:
    return f"{stem}.{EXTENSIONS.get(fmt, fmt)}"
