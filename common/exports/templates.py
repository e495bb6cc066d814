"""Export templates (Excel templates), written in TOML or JSON, checked with one-line
errors and normalised into one structure.

A template is one table or several on one sheet (``tables``). A table has a column header tree
(``col``: nodes with ``title`` and either ``name``, the field a leaf shows, or ``children``; any
depth, leaves at different depths are merged down to the deepest header row), optionally a row
header tree (``row``: leaves name a value of ``row_field`` and hold ``row_count`` rows, default 1),
``title``, ``summary``, ``header`` and ``footer`` (key/value pairs above and below the table) and
``status`` (the HTTP status codes this table keeps). The sheet has ``sheet``, ``default_width`` and
``default_height`` (points). Short forms are accepted: ``{"url": "Address", ...}``
(field -> title), ``[{"name": "url", "title": "Address"}, ...]``, ``{"col": [...], "row": [...]}``;
and the first template form of this project, ``[[columns]]`` with ``header = [...]`` and ``field``.

Pure code: the master checks a template when an export is requested; the worker writes with it.
"""
from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from common.errors import ValidationError, too_many_digits

FIELDS = ("url", "status_code", "response_size", "body_text", "body_sha256", "encoding", "response_headers",
          "remote_ip", "hostname", "task", "add_datetime")
BODY_FIELDS = frozenset({"body_text", "body_sha256", "response_size"})
ROW_FIELDS = ("status_code", "hostname", "encoding", "remote_ip", "url")
SHEET_RE = re.compile(r"^[^\[\]:*?/\\']{1,31}$")
MAX_TEMPLATE = 64 * 1024
MAX_DEPTH, MAX_LEAVES, MAX_TABLES, MAX_PAIRS = 8, 200, 20, 50
MAX_ROW_HEAD_ROWS = 10_000  # rows reserved by row headers, all tables together
TABLE_KEYS = {"title", "summary", "header", "footer", "col", "row", "row_field", "status", "columns"}
# a caller's (general) template's nodes may also carry the /v1 interface's style keys, flat or in "style"
STYLE_KEYS = {"type", "color", "bg_color", "bold", "align", "height", "style"}
ALIGNS = ("left", "center", "right")
COLOR_RE = re.compile(r"^(black|white|red|green|blue|yellow|cyan|#?[0-9A-Fa-f]{6}|#?[0-9A-Fa-f]{3})?$")
SHEET_KEYS = {"sheet", "default_width", "default_height", "tables"}


@dataclass(frozen=True)
class Style:
    """How a column's data cells look (the keys /v1 callers give a template's leaves)."""
    align: str = ""                # left, center or right
    bold: bool = False
    color: str = ""                # the font's colour: a name or RRGGBB
    bg_color: str = ""


@dataclass(frozen=True)
class Node:
    """A header cell: a leaf shows a field (column tree) or holds rows of a value (row tree)."""
    title: str
    name: str = ""                 # leaf: the field (col) or the row_field value (row)
    format: str = ""               # col leaf: Excel number format
    width: float | None = None     # col leaf: points (a /v1 task's: Excel's character widths)
    row_count: int = 1             # row leaf: data rows it holds
    children: tuple["Node", ...] = ()
    style: Style | None = None     # col leaf of a caller's template: its data cells' look
    auto_width: bool = False       # col leaf: width -1, as wide as what it shows

    @property
    def leaf(self) -> bool:
        return not self.children

    def leaves(self) -> list["Node"]:
        return [self] if self.leaf else [x for c in self.children for x in c.leaves()]

    def depth(self) -> int:
        return 1 if self.leaf else 1 + max(c.depth() for c in self.children)

    def breadth(self, rows: bool = False) -> int:
        return (self.row_count if rows else 1) if self.leaf else sum(c.breadth(rows) for c in self.children)

    def canonical(self) -> dict:
        out: dict[str, Any] = {"title": self.title}
        if self.leaf:
            out |= {"name": self.name, "format": self.format, "width": self.width,
                    "row_count": self.row_count}
        else:
            out["children"] = [c.canonical() for c in self.children]
        return out


@dataclass(frozen=True)
class Placed:
    """Where a header node lands: ``level`` (row of a column header, column of a row header),
    ``offset`` along the other axis, and how far it spans along each."""
    node: Node
    level: int
    offset: int
    levels: int
    span: int


def place(nodes: tuple[Node, ...], rows: bool = False) -> list[Placed]:
    """Header layout: a node's level is its depth; the first child starts where its parent
    does and each next one after its elder siblings' breadth; an inner node spans its breadth,
    a leaf spans down to the deepest level (a row leaf spans its row_count)."""
    deepest = max(n.depth() for n in nodes)
    out: list[Placed] = []

    def walk(node: Node, level: int, offset: int) -> None:
        out.append(Placed(node, level, offset, deepest - level if node.leaf else 1, node.breadth(rows)))
        for child in node.children:
            walk(child, level + 1, offset)
            offset += child.breadth(rows)

    offset = 0
    for node in nodes:
        walk(node, 0, offset)
        offset += node.breadth(rows)
    return out


@dataclass(frozen=True)
class Table:
    col: tuple[Node, ...]
    row: tuple[Node, ...] = ()
    row_field: str = ""
    title: str = ""
    summary: str = ""
    header: tuple[tuple[str, str], ...] = ()
    footer: tuple[tuple[str, str], ...] = ()
    status: tuple[int, ...] = ()

    @property
    def columns(self) -> list[Node]:
        return [x for n in self.col for x in n.leaves()]

    @property
    def depth(self) -> int:
        return max(n.depth() for n in self.col)

    @property
    def row_depth(self) -> int:
        return max((n.depth() for n in self.row), default=0)

    @property
    def row_leaves(self) -> list[Node]:
        return [x for n in self.row for x in n.leaves()]

    @property
    def width(self) -> int:
        return self.row_depth + len(self.columns)

    def canonical(self) -> dict:
        return {"col": [n.canonical() for n in self.col], "row": [n.canonical() for n in self.row],
                "row_field": self.row_field, "title": self.title, "summary": self.summary,
                "header": [list(p) for p in self.header], "footer": [list(p) for p in self.footer],
                "status": list(self.status)}


@dataclass(frozen=True)
class Template:
    tables: tuple[Table, ...]
    sheet: str = "data"
    default_width: float | None = None
    default_height: float | None = None
    width_chars: bool = False      # widths are Excel's character widths (a /v1 task's), not points
    row_offset: int = 0            # blank rows above the first table (a /v1 task's rowoffset)
    header_align: str = ""         # the header and footer pairs' alignment (left, center, right)
    footer_align: str = ""

    @property
    def plain(self) -> bool:
        """One table of columns only: what CSV and JSON Lines can hold."""
        return len(self.tables) == 1 and not self.tables[0].row

    @property
    def columns(self) -> list[Node]:
        return self.tables[0].columns

    @property
    def needs_body(self) -> bool:
        return any(c.name in BODY_FIELDS for t in self.tables for c in t.columns)

    @property
    def needs_headers(self) -> bool:
        return any(c.name == "response_headers" for t in self.tables for c in t.columns)

    def canonical(self) -> dict:
        return {
            "sheet": self.sheet,
            "default_width": self.default_width,
            "default_height": self.default_height,
            "tables": [t.canonical() for t in self.tables],
        }


DEFAULT = Template((Table(tuple(Node(f, f) for f in FIELDS)),))


def parse_template(text: str | None, general: bool = False) -> Template:
    """The template in ``text`` (JSON when it is an object or a list of objects, TOML otherwise), or every
    field flat when empty; ValidationError with one line otherwise. ``general``: a download task's
    template, whose leaves name keys of the caller's rows (any text), not this cluster's fields."""
    if not text or not text.strip():
        return DEFAULT
    if len(text) > MAX_TEMPLATE:
        raise ValidationError(f"template: larger than {MAX_TEMPLATE} characters")
    head = text.lstrip()
    if head.startswith("{") or (head.startswith("[") and head[1:].lstrip()[:1] in ("{", "]", '"')):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(
                f"template is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        except RecursionError:  # the parser recurses once per level
            raise ValidationError("template nests too deeply") from None
        except ValueError:  # an integer past Python's digit limit
            raise too_many_digits("template") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError(f"template is not valid TOML: {str(exc).splitlines()[0]}") from None
        except RecursionError:
            raise ValidationError("template nests too deeply") from None
        except ValueError:
            raise too_many_digits("template") from None
    return from_data(data, general)


def from_data(data: Any, general: bool = False) -> Template:
    data = _long_form(data)
    sheet = data.get("sheet", "data")
    if not isinstance(sheet, str) or not SHEET_RE.match(sheet):
        raise ValidationError("template: sheet must be 1-31 characters without []:*?/\\'")
    widths = {k: _points(data.get(k), k) for k in ("default_width", "default_height")}
    tables = _tables(data, general)
    if sum(leaf.row_count for t in tables for leaf in t.row_leaves) > MAX_ROW_HEAD_ROWS:
        raise ValidationError(f"template: row headers hold more than {MAX_ROW_HEAD_ROWS} rows in all")
    return Template(tables, sheet, widths["default_width"], widths["default_height"])


def _long_form(data: Any) -> dict:
    """The template as a table of known keys: a list is its ``col``, ``{field: title}`` its columns."""
    if isinstance(data, list):
        data = {"col": data}
    if not isinstance(data, dict) or not data:
        raise ValidationError("template: must be a table (TOML) or an object or list (JSON)")
    if not set(data) & (TABLE_KEYS | SHEET_KEYS) and all(isinstance(v, str) for v in data.values()):
        data = {"col": [{"name": k, "title": v} for k, v in data.items()]}  # {field: title}
    unknown = sorted(set(data) - TABLE_KEYS - SHEET_KEYS)
    if unknown:
        raise ValidationError(f"template: unknown key {unknown[0]!r}")
    return data


def _tables(data: dict, general: bool) -> tuple[Table, ...]:
    """The sheet's tables: each of ``tables``, or the one table the template's own keys make."""
    if "tables" not in data:
        return (_table({k: v for k, v in data.items() if k in TABLE_KEYS}, "template", general),)
    if set(data) & TABLE_KEYS:
        raise ValidationError(
            f"template: with tables, {sorted(set(data) & TABLE_KEYS)[0]!r} goes inside each table"
        )
    raw = data["tables"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_TABLES:
        raise ValidationError(f"template: tables must be a list of 1-{MAX_TABLES} tables")
    return tuple(_table(t, f"tables[{i}]", general) for i, t in enumerate(raw))


def _points(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 1000:
        raise ValidationError(f"template: {where} must be a number of points from 1 to 1000")
    return float(value)


def _text(value: Any, where: str, limit: int = 255) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or len(str(value)) > limit:
        raise ValidationError(f"template: {where} must be a string of at most {limit} characters")
    return str(value)


def _pairs(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MAX_PAIRS:
        raise ValidationError(f"template: {where} must be key/value pairs (at most {MAX_PAIRS})")
    return tuple((_text(k, f"{where} key"), _text(v, f"{where}.{k}", 1024)) for k, v in value.items())


def _table(data: Any, where: str, general: bool = False) -> Table:
    if not isinstance(data, dict):
        raise ValidationError(f"{where}: must be a table of title, col, row, ...")
    unknown = sorted(set(data) - TABLE_KEYS)
    if unknown:
        raise ValidationError(f"{where}: unknown key {unknown[0]!r}")
    col = _column_tree(data, where, general)
    row, row_field = _row_tree(data, where, general)
    status = _status(data.get("status", []), where)
    return Table(
        col,
        row,
        row_field,
        _text(data.get("title", ""), f"{where}.title"),
        _text(data.get("summary", ""), f"{where}.summary", 2048),
        _pairs(data.get("header"), f"{where}.header"),
        _pairs(data.get("footer"), f"{where}.footer"),
        status,
    )


def _column_tree(data: dict, where: str, general: bool) -> tuple[Node, ...]:
    """A table's column headers, from ``col`` (a tree) or ``columns`` (the flat form)."""
    if "columns" in data and "col" in data:
        raise ValidationError(f"{where}: give col or columns, not both")
    col = (
        _columns(data["columns"], where, general)
        if "columns" in data
        else _tree(data.get("col"), f"{where}.col", rows=False, general=general)
    )
    leaves = [x for n in col for x in n.leaves()]
    if len(leaves) > MAX_LEAVES:
        raise ValidationError(f"{where}: more than {MAX_LEAVES} columns")
    return col


def _row_tree(data: dict, where: str, general: bool) -> tuple[tuple[Node, ...], str]:
    """A table's row headers and the field whose value picks a row leaf; none without ``row``."""
    row_field = data.get("row_field", "")
    if data.get("row") is None:
        if row_field:
            raise ValidationError(f"{where}: row_field without row headers")
        return (), row_field
    row = _tree(data["row"], f"{where}.row", rows=True)
    if general:  # the caller's rows say their leaf in _row_head_ (or in row_field, if named)
        row_field = _text(row_field or "_row_head_", f"{where}.row_field")
    elif row_field not in ROW_FIELDS:
        raise ValidationError(f"{where}: row headers need row_field, one of {', '.join(ROW_FIELDS)}")
    names = [leaf.name for n in row for leaf in n.leaves()]
    if len(set(names)) != len(names):
        raise ValidationError(f"{where}.row: two leaves name the same value")
    return row, row_field


def _status(status: Any, where: str) -> tuple[int, ...]:
    """The HTTP status codes a table keeps, sorted (none: every one)."""
    if not isinstance(status, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in status
    ):
        raise ValidationError(f"{where}: status must be a list of HTTP status codes")
    return tuple(sorted(set(status)))


def _tree(raw: Any, where: str, rows: bool, level: int = 1, general: bool = False) -> tuple[Node, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValidationError(f"{where}: needs a list of header nodes")
    if level > MAX_DEPTH:
        raise ValidationError(f"{where}: deeper than {MAX_DEPTH} levels")
    return tuple(_node(n, f"{where}[{i}]", rows, level, general) for i, n in enumerate(raw))


def _node(raw: Any, where: str, rows: bool, level: int, general: bool = False) -> Node:
    allowed = ({"title", "name", "children"} | ({"row_count"} if rows else {"format", "width"})
               | (STYLE_KEYS | {"width"} if general else set()))
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: a header node must be a table with title and name or children")
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValidationError(f"{where}: unknown key {unknown[0]!r} (takes {', '.join(sorted(allowed))})")
    if "children" in raw:
        if "name" in raw:
            raise ValidationError(f"{where}: a node has a name (a leaf) or children, not both")
        children = _tree(raw["children"], f"{where}.children", rows, level + 1, general)
        return Node(_text(raw.get("title", ""), f"{where}.title"), children=children)
    name = raw.get("name")
    if rows:
        name = _text(name, f"{where}.name") if name is not None else None
        count = raw.get("row_count", 1)
        if name is None:
            raise ValidationError(f"{where}: a row leaf needs name (the row_field value it holds)")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ROW_HEAD_ROWS:
            raise ValidationError(f"{where}: row_count must be a whole number from 1 to {MAX_ROW_HEAD_ROWS}")
        return Node(_text(raw.get("title", name), f"{where}.title"), name, row_count=count)
    if general:
        name = _text(name, f"{where}.name") if name not in (None, "") else None
        if name is None:
            raise ValidationError(f"{where}: a column leaf needs name (the key of the rows it shows)")
    elif name not in FIELDS:
        raise ValidationError(f"{where}: unknown field {str(name)[:40]!r} (one of {', '.join(FIELDS)})")
    fmt = raw.get("format", "")
    if not isinstance(fmt, str) or len(fmt) > 64:
        raise ValidationError(f"{where}: format must be an Excel number format of at most 64 characters")
    if general and set(raw) & (STYLE_KEYS | {"width"}):
        style, width, auto = _style(raw, where)
        return Node(_text(raw.get("title", name), f"{where}.title"), name, fmt, width, style=style,
                    auto_width=auto)
    return Node(
        _text(raw.get("title", name), f"{where}.title"),
        name,
        fmt,
        _points(raw.get("width"), f"{where}.width"),
    )


def _style(raw: dict, where: str) -> tuple[Style | None, float | None, bool]:
    """A caller's leaf style (/v1: ``style`` {...}, else the flat keys): the look of its
    cells, its width (0: the default; negative: as wide as its cells) and whether it is automatic.
    ``type`` and ``height`` are taken and not used (the cell's type follows its value; rows have
    the task's default_height)."""
    cfg = raw["style"] if isinstance(raw.get("style"), dict) else raw
    if "style" in raw and not isinstance(raw["style"], dict):
        raise ValidationError(f"{where}.style must be an object of width, align, bold, color, bg_color")
    align, bold = cfg.get("align") or "", cfg.get("bold", False)
    if align not in ("", *ALIGNS):
        raise ValidationError(f"{where}: align must be left, center or right")
    for key in ("color", "bg_color"):
        if not isinstance(cfg.get(key, ""), str) or not COLOR_RE.match(cfg.get(key, "")):
            raise ValidationError(f"{where}: {key} must be a colour name or RRGGBB")
    for key in ("width", "height"):
        value = cfg.get(key, 0)
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,4}", value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -4000 <= value <= 4000:
            raise ValidationError(f"{where}: {key} must be a number up to 4000")
    width = float(cfg.get("width") or 0)
    if width > 255:
        raise ValidationError(f"{where}: width must be at most 255 (Excel's widest column)")
    style = Style(align, bool(bold) and bold not in ("0", "false"), _color(cfg.get("color", "")),
                  _color(cfg.get("bg_color", "")))
    return (style if style != Style() else None), (width if width > 0 else None), width < 0


def _color(value: str) -> str:
    names = {"black": "#000000", "white": "#FFFFFF", "red": "#FF0000", "green": "#00FF00",
             "blue": "#0000FF", "yellow": "#FFFF00", "cyan": "#00FFFF"}
    if not value:
        return ""
    value = value.lstrip("#")
    if value in names:
        return names[value]
    return "#" + (value if len(value) == 6 else "".join(c * 2 for c in value)).upper()


def _columns(raw: Any, where: str, general: bool = False) -> tuple[Node, ...]:
    """The flat form ``[[columns]]`` (docs/exports.md), each with ``field`` and a ``header`` list
    of titles from the top row down, as a header tree: neighbours with equal header prefixes share
    a parent."""
    if not isinstance(raw, list) or not raw or len(raw) > MAX_LEAVES:
        raise ValidationError(f"{where}: needs 1-{MAX_LEAVES} [[columns]]")
    columns = [_flat_column(col, i, where, general) for i, col in enumerate(raw, 1)]
    if len({len(h) for h, _ in columns}) != 1:
        raise ValidationError(f"{where}: every column needs the same number of header rows (ragged header)")
    return _group(columns, 0)


def _flat_column(col: Any, i: int, where: str, general: bool) -> tuple[tuple[str, ...], Node]:
    """Column ``i`` of the flat form: its header titles, top row down, and its leaf."""
    if not isinstance(col, dict) or set(col) - {"header", "field", "format", "width"}:
        raise ValidationError(f"{where}: column {i} takes only header, field, format and width")
    fld = col.get("field")
    if not (general and isinstance(fld, str) and 0 < len(fld) <= 255) and fld not in FIELDS:
        raise ValidationError(
            f"{where}: column {i}: unknown field {str(fld)[:40]!r} (one of {', '.join(FIELDS)})"
        )
    header = _flat_header(col.get("header", [fld]), i, where)
    fmt = col.get("format", "")
    if not isinstance(fmt, str) or len(fmt) > 64:
        raise ValidationError(f"{where}: column {i}: format must be a short string")
    return tuple(header), Node(header[-1], fld, fmt, _points(col.get("width"), f"column {i} width"))


def _flat_header(header: Any, i: int, where: str) -> list[str]:
    """Column ``i``'s header: one title, or a list of titles from the top row down."""
    header = [header] if isinstance(header, str) else header
    if (
        not isinstance(header, list)
        or not header
        or not all(isinstance(h, str) and len(h) <= 255 for h in header)
    ):
        raise ValidationError(f"{where}: column {i}: header must be a string or a list of strings")
    if len(header) > MAX_DEPTH:
        raise ValidationError(f"{where}: column {i}: more than {MAX_DEPTH} header rows")
    return header


def _group(columns: list[tuple[tuple[str, ...], Node]], level: int) -> tuple[Node, ...]:
    out: list[Node] = []
    i = 0
    while i < len(columns):
        header, leaf = columns[i]
        if level == len(header) - 1:
            out.append(leaf)
            i += 1
            continue
        j = i + 1
        while j < len(columns) and header[level] and columns[j][0][:level + 1] == header[:level + 1]:
            j += 1
        out.append(Node(header[level], children=_group(columns[i:j], level + 1)))
        i = j
    return tuple(out)
