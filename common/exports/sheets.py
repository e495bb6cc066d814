"""Excel files from a template (``common/exports/templates.py``): tables one below the other on a sheet,
each with its title, summary, header pairs, column header tree, row header tree, rows and footer
pairs; set up to print (fit to the page width, landscape when wide, the column headers repeated
on every page of a one-table sheet, page numbers).

Written with xlsxwriter's constant_memory mode, so memory stays bounded whatever the row count:
rows go to a temp file in order and a row once left cannot be written again. A merged range's
padding cells therefore have to be written when their own row comes, not when the range is
declared; ``_Block`` does that, and registers the range with the worksheet's list of merges (the
list ``merge_range`` itself appends to, read when the sheet is closed). Rows past Excel's limit go
on to a new sheet that starts with the table's column headers again.
"""
from __future__ import annotations

import json
import math
import tempfile
import unicodedata
from collections import defaultdict
from datetime import datetime
from typing import IO, Any, Callable, Iterable, Iterator

from common.exports.templates import Node, Table, Template, place

EXCEL_MAX_ROWS = 1_048_576
EXCEL_MAX_CELL = 32_767
PORTRAIT_PIXELS = 720  # wider than an A4 portrait page's printable width: print landscape
WIDE_FIELDS = {"url": 60, "body_text": 60, "response_headers": 60, "body_sha256": 66}
DATE_PIXELS = 135


def cell_text(value: Any) -> Any:
    """A value as a cell holds it: dicts as JSON text, strings capped at Excel's cell limit."""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, ensure_ascii=False, sort_keys=True)
    if isinstance(value, str) and len(value) > EXCEL_MAX_CELL:
        return value[:EXCEL_MAX_CELL]
    return value


def _pixels(points: float | None, chars: int, in_chars: bool = False) -> int:
    """A column's pixels: from a width in points (with ``in_chars``, the width a file states in
    Excel's characters, as PhpSpreadsheet writes the number it is given), else from a number of
    characters."""
    if points and in_chars:
        return round(points * 7)
    return round(points * 4 / 3) if points else chars * 7 + 5


def _chars(value: Any) -> int:
    """How many character widths a value takes in a cell (an East Asian wide character: two)."""
    text = str(cell_text(value)) if value is not None else ""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text[:255])


class _Block:
    """Cells and merged ranges of consecutive rows, written row by row in order."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[int, Any, Any]]] = defaultdict(list)
        self.merges: list[tuple[int, int, int, int]] = []

    def put(self, row: int, col: int, value: Any, fmt: Any) -> None:
        self.rows[row].append((col, value, fmt))

    def span(self, row: int, col: int, last_row: int, last_col: int, value: Any, fmt: Any) -> None:
        """A value whose cell covers rows row..last_row and columns col..last_col."""
        for r in range(row, last_row + 1):
            for c in range(col, last_col + 1):
                self.put(r, c, value if (r, c) == (row, col) else None, fmt)
        if (row, col) != (last_row, last_col):
            self.merges.append((row, col, last_row, last_col))


class _Writer:
    def __init__(self, book, template: Template) -> None:
        self.book, self.template = book, template
        # xlsxwriter's Worksheet (untyped) once new_sheet has run; room() is False before that
        self.sheet: Any = None
        self.line, self.count = 0, 0
        self.fmt_head = book.add_format({"bold": True, "align": "center", "valign": "vcenter",
                                         "bg_color": "#E8ECF4", "border": 1, "text_wrap": True})
        self.fmt_title = book.add_format({"bold": True, "font_size": 14, "align": "center",
                                          "valign": "vcenter"})
        self.fmt_summary = book.add_format({"text_wrap": True, "valign": "top"})
        self.fmt_key = book.add_format({"bold": True})
        self.fmt_value = book.add_format({"align": "left"})
        self.cells: dict[tuple, Any] = {}
        self.widths = self._widths()
        self.sheets: list[Any] = []
        self.auto = self._auto()   # column -> widest text so far (width -1: as wide as its cells)

    # --- sheets --------------------------------------------------------------------------

    def _widths(self) -> list[int]:
        """Each column's width in pixels: the widest any table gives it."""
        widths: dict[int, int] = {}
        default, chars = self.template.default_width, self.template.width_chars
        for table in self.template.tables:
            for i in range(table.row_depth):
                widths[i] = max(widths.get(i, 0), _pixels(default, 16, chars))
            for i, leaf in enumerate(table.columns, table.row_depth):
                px = _pixels(leaf.width or default, WIDE_FIELDS.get(leaf.name, 18), chars)
                if leaf.name == "add_datetime" and not leaf.width:
                    px = max(px, DATE_PIXELS)  # a date-time shown whole, not as ###
                widths[i] = max(widths.get(i, 0), px)
        return [widths[i] for i in range(max(widths) + 1)]

    def _auto(self) -> dict[int, int]:
        """The columns as wide as their cells (every table's leaf there says width -1), each
        starting from its headers' titles."""
        auto: dict[int, int] = {}
        for table in self.template.tables:
            for i, leaf in enumerate(table.columns, table.row_depth):
                if leaf.auto_width:
                    auto[i] = max(auto.get(i, 0), _chars(leaf.title))
        return auto

    def fit(self) -> None:
        """Set the automatic columns' widths on every sheet (read when the book is closed)."""
        for sheet in self.sheets:
            for col, chars in self.auto.items():
                sheet.set_column_pixels(col, col, (min(chars, 100) + 2) * 7 + 5)

    def new_sheet(self) -> None:
        self.count += 1
        name = self.template.sheet if self.count == 1 else f"{self.template.sheet[:25]} ({self.count})"
        sheet = self.sheet = self.book.add_worksheet(name)
        self.sheets.append(sheet)
        self.line = 0
        for col, px in enumerate(self.widths):
            sheet.set_column_pixels(col, col, px)
        if self.template.default_height:
            sheet.set_default_row(self.template.default_height)
        sheet.set_paper(9)  # A4
        if sum(self.widths) > PORTRAIT_PIXELS:
            sheet.set_landscape()
        sheet.fit_to_pages(1, 0)  # as wide as one page, as many pages down as it takes
        sheet.center_horizontally()
        sheet.set_footer("&CPage &P of &N")

    def room(self, rows: int) -> bool:
        return self.sheet is not None and self.line + rows <= EXCEL_MAX_ROWS

    def emit(self, block: _Block) -> None:
        """Write a block whose row numbers count from the current line."""
        for r in sorted(block.rows):
            for col, value, fmt in sorted(block.rows[r], key=lambda x: x[0]):
                self.value(self.line + r, col, value, fmt)
        for r1, c1, r2, c2 in block.merges:
            self.sheet.merge.append([self.line + r1, c1, self.line + r2, c2])  # see the module's docstring
        self.line += max(block.rows) + 1 if block.rows else 0

    # --- cells ---------------------------------------------------------------------------

    def fmt_cell(self, leaf: Node, value: Any) -> Any:
        number = leaf.format or ("yyyy-mm-dd hh:mm:ss" if isinstance(value, datetime) else "")
        key = (number, leaf.style)
        if key not in self.cells:
            look: dict[str, Any] = {"border": 1, "valign": "top"}
            if number:
                look["num_format"] = number
            style = leaf.style
            if style is not None:
                given = {"align": style.align, "bold": style.bold, "font_color": style.color,
                         "bg_color": style.bg_color}
                look |= {k: v for k, v in given.items() if v}
            self.cells[key] = self.book.add_format(look)
        return self.cells[key]

    def seen(self, col: int, value: Any) -> None:
        """Note a value written in an automatic column."""
        if col in self.auto and value is not None:
            self.auto[col] = max(self.auto[col], _chars(value))

    def value(self, row: int, col: int, value: Any, fmt: Any) -> None:
        sheet = self.sheet
        if isinstance(value, datetime):
            sheet.write_datetime(row, col, value, fmt)
        elif value is None or value == "":
            sheet.write_blank(row, col, None, fmt)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            sheet.write_number(row, col, value, fmt)
        else:
            sheet.write_string(row, col, str(cell_text(value)), fmt)

    # --- a table -------------------------------------------------------------------------

    def pairs(self, table: Table, pairs: tuple[tuple[str, str], ...], align: str = "") -> None:
        block, fmt = _Block(), self.fmt_value
        if align:
            fmt = self.cells.get(("pairs", align)) or self.book.add_format({"align": align})
            self.cells[("pairs", align)] = fmt
        for i, (key, text) in enumerate(pairs):
            if table.width == 1:
                block.put(i, 0, f"{key}: {text}", fmt)
                continue
            block.put(i, 0, key, self.fmt_key)
            block.span(i, 1, i, table.width - 1, text, fmt)
        self.emit(block)

    def heading(self, table: Table) -> None:
        last = table.width - 1
        if table.title:
            block = _Block()
            block.span(0, 0, 0, last, table.title, self.fmt_title)
            self.sheet.set_row(self.line, 24)
            self.emit(block)
        if table.summary:
            block = _Block()
            block.span(0, 0, 0, last, table.summary, self.fmt_summary)
            chars = max(10, sum(self.widths[:table.width]) // 7)
            self.sheet.set_row(self.line, min(409, 15 * math.ceil(len(table.summary) / chars)))
            self.emit(block)
        self.pairs(table, table.header, self.template.header_align)

    def column_headers(self, table: Table, single: bool) -> None:
        block, offset = _Block(), table.row_depth
        if offset:
            block.span(0, 0, table.depth - 1, offset - 1, "", self.fmt_head)
        for p in place(table.col):
            block.span(p.level, offset + p.offset, p.level + p.levels - 1, offset + p.offset + p.span - 1,
                       p.node.title, self.fmt_head)
        if single:  # printed: these rows on top of every page
            self.sheet.repeat_rows(self.line, self.line + table.depth - 1)
        self.emit(block)

    def rows(self, table: Table, rows: Iterable[dict], single: bool) -> int:
        columns, n = table.columns, 0
        for row in rows:
            if not self.room(1):
                self.new_sheet()
                self.column_headers(table, single)
            r = self.line
            for col, leaf in enumerate(columns):
                value = row.get(leaf.name)
                self.value(r, col, value, self.fmt_cell(leaf, value))
                self.seen(col, value)
            self.line += 1
            n += 1
        return n

    def row_headed(self, table: Table, buckets: dict[str, list[dict]]) -> tuple[_Block, int]:
        """The data block of a table with row headers: each row leaf holds its row_count rows
        (blank where fewer rows have its value), headed by the row tree on the left."""
        block, offset, n = _Block(), table.row_depth, 0
        for p in place(table.row, rows=True):
            block.span(p.offset, p.level, p.offset + p.span - 1, p.level + p.levels - 1,
                       p.node.title, self.fmt_head)
        line = 0
        for leaf in table.row_leaves:
            held = buckets.get(leaf.name, [])
            for i in range(leaf.row_count):
                row = held[i] if i < len(held) else {}
                n += bool(row)
                for col, column in enumerate(table.columns, offset):
                    value = row.get(column.name)
                    block.put(line, col, cell_text(value), self.fmt_cell(column, value))
                    self.seen(col, value)
                line += 1
        return block, n

    def table(self, table: Table, rows: Iterable[dict]) -> int:
        single = len(self.template.tables) == 1
        needed = (bool(table.title) + bool(table.summary) + len(table.header) + table.depth
                  + len(table.footer) + sum(leaf.row_count for leaf in table.row_leaves))
        if not self.room(needed if table.row else needed + 1):
            self.new_sheet()
        self.heading(table)
        self.column_headers(table, single)
        if table.row:
            block, n = self.row_headed(table, bucket(table, rows))
            self.emit(block)
        else:
            n = self.rows(table, rows, single)
        if table.footer and not self.room(len(table.footer)):
            self.new_sheet()
        self.pairs(table, table.footer, self.template.footer_align)
        return n


def bucket(table: Table, rows: Iterable[dict] | dict[str, Iterable[dict]]) -> dict[str, list[dict]]:
    """The rows each row leaf holds, at most its row_count: from rows keyed by leaf name (a
    mapping of leaf name to its rows), or from flat rows by their ``_row_head_`` or, failing that,
    their ``row_field`` value. Reading stops once every leaf is full."""
    wanted = {leaf.name: leaf.row_count for leaf in table.row_leaves}
    if isinstance(rows, dict):
        return {name: list(_take(rows.get(name, ()), count)) for name, count in wanted.items()}
    held: dict[str, list[dict]] = {name: [] for name in wanted}
    open_ = len([c for c in wanted.values() if c])
    for row in rows:
        key = row.get("_row_head_", row.get(table.row_field))
        key = "" if key is None else str(key)
        if key in held and len(held[key]) < wanted[key]:
            held[key].append(row)
            if len(held[key]) == wanted[key]:
                open_ -= 1
                if not open_:
                    break
    return held


def _take(rows: Iterable[dict], count: int) -> Iterator[dict]:
    for i, row in enumerate(rows):
        if i >= count:
            return
        yield row


def write_xlsx(template: Template, source: Iterable[dict] | Callable[[Table], Any], out: IO[bytes]) -> int:
    """Write the workbook to ``out``; ``source`` gives each table its rows (a callable taking the
    table, or one iterable for a one-table template). Returns the data rows written."""
    import xlsxwriter

    rows_for = source if callable(source) else (lambda table: source)
    with tempfile.NamedTemporaryFile(suffix=".xlsx") as tmp:
        book = xlsxwriter.Workbook(tmp.name, {"constant_memory": True, "strings_to_urls": False,
                                              "strings_to_formulas": False, "strings_to_numbers": False,
                                              "tmpdir": tempfile.gettempdir()})
        writer, n = _Writer(book, template), 0
        writer.new_sheet()
        writer.line += min(template.row_offset, 1000)
        for i, table in enumerate(template.tables):
            if i and writer.room(1):
                writer.line += 1  # a blank row between tables
            n += writer.table(table, rows_for(table))
        writer.fit()
        book.close()
        while chunk := tmp.read(1024 * 1024):
            out.write(chunk)
    return n
