"""Export files: the template (TOML), the row fields, and CSV / JSON Lines / Excel writers that
stream into a binary file object with bounded memory, whatever the row count.

A template names columns, each with a header (one entry per header row; equal neighbours in a
row are merged in Excel) and a field; without one, every field in a flat header row. Pure code:
checked at request time by the master, used by the worker that writes the file.
"""
from __future__ import annotations

import csv
import io
import json
import re
import tempfile
import tomllib
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any, Iterable

from common.errors import ValidationError
from common.models import iso

FIELDS = ("url", "status_code", "response_size", "body_text", "body_sha256", "encoding", "remote_ip",
          "hostname", "task", "add_datetime")
BODY_FIELDS = {"body_text", "body_sha256", "response_size"}
EXCEL_MAX_ROWS = 1_048_576
EXCEL_MAX_CELL = 32_767
SHEET_RE = re.compile(r"^[^\[\]:*?/\\]{1,31}$")
MAX_TEMPLATE = 64 * 1024


@dataclass(frozen=True)
class Column:
    header: tuple[str, ...]
    field: str
    format: str = ""


@dataclass(frozen=True)
class Template:
    columns: tuple[Column, ...]
    sheet: str = "data"

    @property
    def depth(self) -> int:
        return len(self.columns[0].header)

    @property
    def needs_body(self) -> bool:
        return any(c.field in BODY_FIELDS for c in self.columns)

    def canonical(self) -> dict:
        return {"sheet": self.sheet, "columns": [[list(c.header), c.field, c.format] for c in self.columns]}


DEFAULT = Template(tuple(Column((f,), f) for f in FIELDS))


def parse_template(text: str | None) -> Template:
    """The template in ``text`` (TOML), or every field flat when empty; ValidationError otherwise."""
    if not text or not text.strip():
        return DEFAULT
    if len(text) > MAX_TEMPLATE:
        raise ValidationError(f"template: larger than {MAX_TEMPLATE} characters")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"template is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"sheet", "columns"})
    if unknown:
        raise ValidationError(f"template: unknown key {unknown[0]!r}")
    sheet = data.get("sheet", "data")
    if not isinstance(sheet, str) or not SHEET_RE.match(sheet):
        raise ValidationError("template: sheet must be 1-31 characters without []:*?/\\")
    raw = data.get("columns")
    if not isinstance(raw, list) or not raw or len(raw) > 200:
        raise ValidationError("template: needs 1-200 [[columns]]")
    columns = []
    for i, col in enumerate(raw, 1):
        if not isinstance(col, dict) or set(col) - {"header", "field", "format"}:
            raise ValidationError(f"template: column {i} takes only header, field and format")
        field = col.get("field")
        if field not in FIELDS:
            raise ValidationError(f"template: column {i}: unknown field {field!r} (one of {', '.join(FIELDS)})")
        header = col.get("header", [field])
        header = [header] if isinstance(header, str) else header
        if not isinstance(header, list) or not header or not all(isinstance(h, str) and len(h) <= 255 for h in header):
            raise ValidationError(f"template: column {i}: header must be a string or a list of strings")
        fmt = col.get("format", "")
        if not isinstance(fmt, str) or len(fmt) > 64:
            raise ValidationError(f"template: column {i}: format must be a short string")
        columns.append(Column(tuple(header), field, fmt))
    if len({len(c.header) for c in columns}) != 1:
        raise ValidationError("template: every column needs the same number of header rows (ragged header)")
    return Template(tuple(columns), sheet)


def merges(row: tuple[str, ...]) -> list[tuple[int, int]]:
    """(first, last) column index of each run of two or more equal neighbours in a header row."""
    runs, start = [], 0
    for i in range(1, len(row) + 1):
        if i == len(row) or row[i] != row[start]:
            if i - 1 > start and row[start]:
                runs.append((start, i - 1))
            start = i
    return runs


# --- writers -------------------------------------------------------------------------------

def _cell(value: Any, limit: bool) -> Any:
    if isinstance(value, str) and limit and len(value) > EXCEL_MAX_CELL:
        return value[:EXCEL_MAX_CELL]
    return value


def write_csv(template: Template, rows: Iterable[dict], out: IO[bytes]) -> int:
    """One header row (the template's last), then a row per record; cells capped for Excel."""
    buf = io.StringIO()
    writer = csv.writer(buf)

    def flush() -> None:
        out.write(buf.getvalue().encode("utf-8"))
        buf.seek(0)
        buf.truncate()

    writer.writerow([c.header[-1] for c in template.columns])
    n = 0
    for row in rows:
        writer.writerow([iso(_cell(row.get(c.field), True)) for c in template.columns])
        n += 1
        if buf.tell() >= 256 * 1024:
            flush()
    flush()
    return n


def write_jsonl(template: Template, rows: Iterable[dict], out: IO[bytes]) -> int:
    n = 0
    for row in rows:
        record = {c.header[-1]: iso(row.get(c.field)) for c in template.columns}
        out.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        n += 1
    return n


def write_xlsx(template: Template, rows: Iterable[dict], out: IO[bytes]) -> int:
    """Excel through xlsxwriter's constant_memory mode (rows go to a temp file as written): the
    header rows with merged group cells, then the rows; a new sheet past Excel's row limit."""
    import xlsxwriter

    with tempfile.NamedTemporaryFile(suffix=".xlsx") as tmp:
        book = xlsxwriter.Workbook(tmp.name, {"constant_memory": True, "strings_to_urls": False,
                                              "strings_to_formulas": False, "strings_to_numbers": False,
                                              "tmpdir": tempfile.gettempdir()})
        bold = book.add_format({"bold": True, "align": "center", "valign": "vcenter", "bg_color": "#E8ECF4", "border": 1})
        formats = {c.format: book.add_format({"num_format": c.format}) for c in template.columns if c.format}
        default_date = book.add_format({"num_format": "yyyy-mm-dd hh:mm:ss"})
        per_sheet = EXCEL_MAX_ROWS - template.depth
        sheet, n, line = None, 0, 0
        for row in rows:
            if sheet is None or line >= per_sheet + template.depth:
                index = n // per_sheet + 1
                sheet = book.add_worksheet(template.sheet if index == 1 else f"{template.sheet[:25]} ({index})")
                _headers(sheet, template, bold)
                line = template.depth
            for col, c in enumerate(template.columns):
                value = row.get(c.field)
                if isinstance(value, datetime):
                    sheet.write_datetime(line, col, value, formats.get(c.format, default_date))
                elif value is None:
                    sheet.write_blank(line, col, None)
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    sheet.write_number(line, col, value, formats.get(c.format))
                else:
                    sheet.write_string(line, col, _cell(str(value), True))
            line += 1
            n += 1
        if sheet is None:
            _headers(book.add_worksheet(template.sheet), template, bold)
        book.close()
        while chunk := tmp.read(1024 * 1024):
            out.write(chunk)
    return n


def _headers(sheet, template: Template, fmt) -> None:
    for r in range(template.depth):
        row = tuple(c.header[r] for c in template.columns)
        merged = {}
        for first, last in merges(row):
            merged.update({i: (first, last) for i in range(first, last + 1)})
        for col, title in enumerate(row):
            span = merged.get(col)
            if span and span[0] == col:
                sheet.merge_range(r, span[0], r, span[1], title, fmt)
            elif not span:
                sheet.write_string(r, col, title, fmt)
    for col, c in enumerate(template.columns):
        sheet.set_column(col, col, 60 if c.field in ("url", "body_text") else 18)


WRITERS = {"csv": write_csv, "jsonl": write_jsonl, "xlsx": write_xlsx}
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson",
                 "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"}
