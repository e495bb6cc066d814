"""Where a download task's rows come from (the general download center): ``source_data``,
the rows given inline with the download task, or ``source_url``, pulled page by page.

The pull: ``GET source_url`` with ``page`` (from 0), ``page_size`` (the download task's ``step``) and
``_task_id`` added to its query (and, when the center has CENTER_APP_ID, ``app_id`` and a
``token`` signed as the /v1 interface's callers sign: ``common.signing.wecar_token``); the answer is
``{"status", "msg", "data": {"data": [rows], "total"?, "force_continue"?, "header"?, "footer"?,
"template"?}}``. Pages are read one at a time and their rows handed on (to an export writer)
before the next is asked for, so memory holds one page whatever ``total`` says; a page of more
objects and lists than OBJECTS_PER_ROW a row of ``page_size`` (counted before it is parsed,
``parse_page``) is refused, so one page costs about twice its bytes. It stops when ``total`` rows
have come, or without a total at the first page shorter than page_size; ``force_continue`` (not
0) asks for the next page whatever the length. An empty page before ``total``, a page that goes
past it, or more than SOURCE_MAX_ROWS rows means the source lied and the download task fails. A page that
answers 5xx or 429, times out, or is not JSON of that shape is tried again (SOURCE_RETRIES tries,
waits doubling from SOURCE_RETRY_DELAY); then ``SourceFailed`` with one line. The first page's
``template``, ``header`` and ``footer`` override the download task's.

Addresses: the URL is read by the webhooks' parser (``common.notify.callback_target``: plain
http(s), printable ASCII, no user info); its host is resolved once per pull and every address
judged by ``common/netguard.py`` (public only unless SOURCE_ALLOW_PRIVATE, never a service of the
cluster); the requests connect to the judged address, with the name in ``Host`` and, for https,
in SNI and the certificate check — no second lookup a rebinding name could answer differently.

Pure of the store: the master checks a download task's source here, the worker (``slave/exporter.py``) and
the synchronous download pull and write with it.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit

import certifi
import urllib3

from common import netguard
from common.config import settings
from common.errors import AddressRefused, SourceFailed, ValidationError, too_many_digits
from common.exports.tabular import WRITERS, check_fits
from common.exports.templates import Node, Style, Table, Template, from_data, parse_template

if TYPE_CHECKING:
    from common.store.records import DownloadTaskParams

logger = logging.getLogger(__name__)
SOURCE_HINT = "private sources need a project an administrator opened to them"
USER_AGENT = "downcluster-center/1.0"
MAX_PAIRS, MAX_TEXT = 50, 2048
# objects and lists a source page may hold for each row of its page_size (a row, its cells' JSON)
OBJECTS_PER_ROW = 64


# --- checking what a download task says (the master, at delivery) ------------------------------------

@dataclass(frozen=True)
class Target:
    """A checked source_url: where to connect (judged addresses) and what to ask."""
    url: str
    scheme: str
    host: str
    port: int
    target: str          # path and query as given
    host_header: str
    addresses: tuple[str, ...]


def check_source_url(url: Any, allow_private: bool | None = None) -> Target:
    """``url`` as a pull will reach it: ValidationError (one line) unless it is a plain http(s) URL
    whose host resolves only to addresses a source may have."""
    from common.notify import callback_target

    allow = settings.SOURCE_ALLOW_PRIVATE if allow_private is None else allow_private
    try:
        parsed = callback_target(url)
    except ValidationError as exc:
        raise ValidationError(str(exc).replace("callback_url", "source_url", 1)) from None
    try:
        addresses = netguard.resolve(parsed.host, parsed.port, allow, SOURCE_HINT)
    except AddressRefused:  # never which address a name inside resolves to: only that it is not public
        raise ValidationError(f"source_url: {parsed.host} is not a public address ({SOURCE_HINT})") from None
    except OSError:
        raise ValidationError(f"source_url: cannot resolve {parsed.host}") from None
    return Target(url, parsed.scheme, parsed.host, parsed.port, parsed.target, parsed.host_header,
                  tuple(addresses))


def pairs(value: Any, what: str) -> tuple[tuple[str, str], ...] | None:
    """Key/value pairs (``header``, ``footer``) from an object or its JSON text; None when not given."""
    value = _json(value, what)
    if value is None or value == {}:
        return None if value is None else ()
    if not isinstance(value, dict) or len(value) > MAX_PAIRS:
        raise ValidationError(f"{what} must be an object of at most {MAX_PAIRS} key/value pairs")
    out = []
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or len(str(k)) > 255 \
                or len(str(v)) > 1024:
            raise ValidationError(f"{what}.{str(k)[:40]}: a value must be text (at most 1024 characters)")
        out.append((str(k), str(v)))
    return tuple(out)


def text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or len(str(value)) > MAX_TEXT:
        raise ValidationError(f"{what} must be text of at most {MAX_TEXT} characters")
    return str(value)


def _json(value: Any, what: str) -> Any:
    """A structured parameter given as JSON text (a form's field) or as JSON itself."""
    if isinstance(value, str):
        stripped = value.strip()
        if not stripped:
            return None
        if stripped[:1] in "[{":
            try:
                return json.loads(stripped)
            except (json.JSONDecodeError, RecursionError):
                raise ValidationError(f"{what} is not valid JSON") from None
            except ValueError:  # an integer past Python's digit limit
                raise too_many_digits(what) from None
    return value


@dataclass(frozen=True)
class Look:
    """How a download task's file looks, from its parameters (one entry per table in multi-table mode);
    a source answer's template, header and footer override them."""
    template: Any = None                       # the template's data (JSON), or None: the rows' keys
    title: tuple[str | None, ...] = (None,)
    summary: tuple[str | None, ...] = (None,)
    header: tuple[tuple | None, ...] = (None,)
    footer: tuple[tuple | None, ...] = (None,)
    default_width: float | None = None
    default_height: float | None = None
    keys_only: bool = False                    # the header is the rows' keys (a /v1 task's CSV)
    v1: DownloadTaskParams | None = None       # a /v1 task's (col_align, header_align, footer_align,
                                               # rowoffset); its widths in characters


def look_of(params: DownloadTaskParams) -> Look:
    """The look a download task's parameters give (``master.center.params.check`` made them)."""
    n = max(1, params.tables)

    def each(given: tuple) -> tuple:
        return given or (None,) * n

    return Look(params.template, each(params.title), each(params.summary), each(params.header),
                each(params.footer), params.default_width, params.default_height, params.keys_header,
                params if params.v1 else None)


def per_table(value: Any, tables: int, what: str, check: Callable[[Any, str], Any]) -> tuple:
    """A parameter of each table: in multi-table mode a list of one per table."""
    if tables == 1:
        return (check(value, what),)
    value = _json(value, what)
    if value is None:
        return (None,) * tables
    if not isinstance(value, list) or len(value) != tables:
        raise ValidationError(f"{what}: in multi-table mode a list of {tables} (one per table)")
    return tuple(check(v, f"{what}[{i}]") for i, v in enumerate(value))


def build_template(look: Look, first_rows: list | dict | None, answer: dict | None = None,
                   index: int = 0, tables: int = 1) -> Template:
    """The template a download task writes with: the source answer's (else the download task's)
    template, or one column per key of the first row; the download task's title, summary, header,
    footer and widths, with the answer's header and footer over them."""
    answer = answer or {}
    template = _template_of(_given_template(look, answer, index, tables), first_rows)
    sheet = replace(template, default_width=look.default_width or template.default_width,
                    default_height=look.default_height or template.default_height)
    if look.v1 is not None:
        sheet = _as_v1(sheet, look.v1)
    return replace(sheet, tables=tuple(_dressed(table, look, answer, index if tables > 1 else i)
                                       for i, table in enumerate(sheet.tables)))


def _as_v1(sheet: Template, v1: DownloadTaskParams) -> Template:
    """A /v1 download task's template as /v1 callers expect it drawn: widths in Excel's characters, the
    rows offset, header and footer aligned, ``col_align`` for the leaves that give no align."""
    align = v1.col_align or ""

    def aligned(node: Node) -> Node:
        if node.children:
            return replace(node, children=tuple(aligned(c) for c in node.children))
        if not align or (node.style is not None and node.style.align):
            return node
        return replace(node, style=replace(node.style or Style(), align=align))

    tables = tuple(replace(t, col=tuple(aligned(n) for n in t.col)) for t in sheet.tables)
    return replace(sheet, tables=tables, width_chars=True, row_offset=int(v1.rowoffset or 0),
                   header_align=v1.header_align or "", footer_align=v1.footer_align or "")


def _given_template(look: Look, answer: dict, index: int, tables: int) -> Any:
    """The source answer's template, else the download task's; in multi-table mode table ``index``'s."""
    if look.keys_only:
        return None
    raw = answer.get("template") if answer.get("template") not in (None, "", [], {}) else look.template
    raw = _json(raw, "template")
    if tables > 1:
        raw = _json(raw[index], "template") if isinstance(raw, list) and len(raw) == tables else None
    return raw


def _template_of(raw: Any, first_rows: list | dict | None) -> Template:
    """``raw`` parsed (TOML text or data); when none is given, one column per key of the first row."""
    if raw in (None, "", [], {}):
        keys = list(first_rows[0]) if isinstance(first_rows, list) and first_rows and isinstance(
            first_rows[0], dict) else []
        keys = [k for k in keys if k != "_row_head_"][:200] or [""]
        return Template((Table(tuple(Node(str(k), str(k)) for k in keys)),))
    if isinstance(raw, str):
        return parse_template(raw, general=True)  # TOML
    return from_data(raw, general=True)


def _dressed(table: Table, look: Look, answer: dict, j: int) -> Table:
    """``table`` with the download task's title, summary, header and footer of table ``j`` over its own, and
    the source answer's header and footer over those."""
    header = pairs(answer["header"], "source header") if answer.get("header") else _nth(look.header, j)
    footer = pairs(answer["footer"], "source footer") if answer.get("footer") else _nth(look.footer, j)
    return replace(
        table,
        title=_nth(look.title, j) or table.title,
        summary=_nth(look.summary, j) or table.summary,
        header=table.header if header is None else header,
        footer=table.footer if footer is None else footer)


def _nth(seq: tuple, j: int) -> Any:
    return seq[j] if j < len(seq) else None


# --- the pull (a worker, or the web process for a synchronous download) ----------------------

def pull_options(params: DownloadTaskParams) -> dict:
    """A download task's Puller options: signed with the center's own app id when it has one (settings),
    and the pause between pages a /v1 task asked for (``interval``, milliseconds)."""
    sign = (settings.CENTER_APP_ID, settings.CENTER_APP_SECRET) if settings.CENTER_APP_ID else None
    return {"sign": sign, "interval": float(params.interval or 0) / 1000}


@dataclass
class Page:
    rows: list
    total: int | None            # None: the source gives no total (pull until a short page)
    answer: dict
    force_continue: Any = None   # the answer's data.force_continue: given, only 0 stops the pull


class Puller:
    """Pulls one download task's source_url page by page over one connection pool to a judged address."""

    def __init__(self, url: str, step: int, task_id: str, allow_private: bool | None = None,
                 sign: tuple[str, str] | None = None, interval: float = 0.0) -> None:
        self.url, self.step, self.task_id = url, step, task_id
        self.allow_private = allow_private
        self.sign, self.interval = sign, interval  # (app_id, secret): signed pulls; seconds between pages
        self.pool: urllib3.HTTPConnectionPool | None = None
        self.target: Target | None = None

    def __enter__(self) -> "Puller":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close()

    def _connect(self) -> urllib3.HTTPConnectionPool:
        try:
            self.target = check_source_url(self.url, self.allow_private)
        except ValidationError as exc:
            raise SourceFailed(str(exc)) from None
        t, timeout = self.target, urllib3.Timeout(connect=min(10.0, settings.SOURCE_TIMEOUT),
                                                  read=settings.SOURCE_TIMEOUT)
        if t.scheme == "https":
            return urllib3.HTTPSConnectionPool(t.addresses[0], t.port, server_hostname=t.host,
                                               assert_hostname=t.host, cert_reqs="CERT_REQUIRED",
                                               ca_certs=certifi.where(), timeout=timeout, retries=False,
                                               maxsize=1)
        return urllib3.HTTPConnectionPool(t.addresses[0], t.port, timeout=timeout, retries=False, maxsize=1)

    def page(self, number: int) -> Page:
        """One page, tried up to SOURCE_RETRIES times; SourceFailed with one line after that."""
        tries, delay = max(1, settings.SOURCE_RETRIES), settings.SOURCE_RETRY_DELAY
        for attempt in range(1, tries + 1):
            try:
                return self._fetch(number)
            except _Retry as exc:
                if attempt == tries:
                    raise SourceFailed(f"source page {number}: {exc} ({tries} tries)") from None
                logger.info("task %s: source page %s: %s; trying again in %.1f s", self.task_id, number,
                            exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _query(self, number: int) -> str:
        """The query a page is asked with: page, page_size, _task_id and, for a signed pull, app_id
        and token (``wecar_token`` over these and the URL's own query parameters, as a receiver
        checking every parameter it is given sees them)."""
        params: dict[str, Any] = {"page": number, "page_size": self.step, "_task_id": self.task_id}
        if self.sign is None:
            return urlencode(params)
        from common.signing import wecar_token  # (pure functions; the module also reads the store)

        app_id, secret = self.sign
        params["app_id"] = app_id
        assert self.target is not None
        own = dict(parse_qsl(urlsplit(self.target.target).query, keep_blank_values=True))
        params["token"] = wecar_token({**own, **params}, secret)
        return urlencode(params)

    def _fetch(self, number: int) -> Page:
        if self.pool is None:
            self.pool = self._connect()
        assert self.target is not None
        path = self.target.target + ("&" if "?" in self.target.target else "?") + self._query(number)
        headers = {"Host": self.target.host_header, "Accept": "application/json", "User-Agent": USER_AGENT}
        deadline = time.monotonic() + settings.SOURCE_TIMEOUT
        try:
            resp = self.pool.urlopen("GET", path, headers=headers, redirect=False, assert_same_host=False,
                                     preload_content=False)
        except (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError) as exc:
            raise _Retry(f"no answer ({type(exc).__name__})") from None
        except urllib3.exceptions.HTTPError as exc:
            raise _Retry(f"connection failed ({type(exc).__name__})") from None
        try:
            if resp.status >= 500 or resp.status == 429:
                raise _Retry(f"answered HTTP {resp.status}")
            if resp.status != 200:
                raise SourceFailed(f"source page {number} answered HTTP {resp.status}")
            text = page_text(_read(resp, deadline))  # the bytes let go once read as text
        finally:
            resp.release_conn()
        return parse_page(text, number, self.step)


class _Retry(Exception):
    """A page to try again: 5xx, 429, timeout, malformed."""


def _read(resp, deadline: float) -> bytearray:
    """The whole body within SOURCE_PAGE_MAX_BYTES and the page's deadline (a source that trickles
    is a source that hangs)."""
    limit, body = settings.SOURCE_PAGE_MAX_BYTES, bytearray()
    try:
        # read1: at most one receive each (each bounded by the read timeout), so the deadline is
        # checked between receives and a trickle cannot stretch a page beyond it
        while chunk := resp.read1(256 * 1024):
            if len(body) + len(chunk) > limit:
                raise SourceFailed(f"a source page is larger than SOURCE_PAGE_MAX_BYTES ({limit} bytes)")
            if time.monotonic() > deadline:
                raise _Retry(f"the page took longer than SOURCE_TIMEOUT ({settings.SOURCE_TIMEOUT:g} s)")
            body += chunk
    except (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError) as exc:
        raise _Retry(f"the answer stopped ({type(exc).__name__})") from None
    return body


def page_text(body: bytes | bytearray) -> str:
    """A page's bytes as text, as ``json.loads`` reads bytes (UTF-8, -16 or -32)."""
    try:
        return body.decode(json.detect_encoding(body), "surrogatepass")
    except UnicodeDecodeError:
        raise _Retry("the answer is not JSON (not UTF-8 text)") from None


def parse_page(body: bytes | bytearray | str, number: int, step: int | None = None) -> Page:
    """A page's answer checked: {"status"?, "msg"?, "data": {"data": [objects], "total": n, ...}}.

    Parsed whole only when its objects and lists (counted by their ``{`` and ``[``, a count that
    strings can only make larger) number at most OBJECTS_PER_ROW a row of ``step`` (the download task's
    page_size): parsed, each costs some 60-100 bytes of memory for its 2-3 bytes of text, so a page
    of millions of ``{}`` is refused in one line before it is made into objects."""
    text = body if isinstance(body, str) else page_text(body)
    if step is not None:
        objects = text.count("{") + text.count("[")
        if objects > OBJECTS_PER_ROW * step + OBJECTS_PER_ROW:
            raise SourceFailed(f"source page {number} holds {objects} objects or lists, more than "
                               f"{OBJECTS_PER_ROW} a row of page_size {step}")
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        head = text[:20].strip().replace("\n", " ")
        raise _Retry(f"the answer is not JSON (begins {head!r})") from None
    if not isinstance(answer, dict):
        raise _Retry("the answer is not a JSON object {status, msg, data}")
    status = answer.get("status", 200)
    if status not in (200, "200", 0, "0"):
        msg = str(answer.get("msg") or "")[:200].replace("\n", " ")
        raise _Retry(f"the answer's status is {str(status)[:20]}: {msg}")
    inner = answer.get("data")
    if not isinstance(inner, dict) or not isinstance(inner.get("data"), list):
        raise _Retry("the answer has no data.data list of rows")
    total = inner.get("total")
    if isinstance(total, str) and total.isdigit():
        total = int(total)
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise _Retry("the answer's data.total is not a whole number")
    rows = inner["data"]
    if not all(isinstance(r, dict) for r in rows):
        raise _Retry("a row of the answer is not an object")
    return Page(rows, total, inner, inner.get("force_continue"))


@dataclass
class Pulled:
    """What a pull knows once its first page came: the template to write with, the total (None
    when the source gives none), and the rows."""
    template: Template
    total: int | None
    rows: Iterator[dict]


def pull(puller: Puller, look: Look) -> Pulled:
    """Read the first page (for its template and total) and give the rows as they come, page by
    page; the iterator raises SourceFailed when the source breaks its word.

    The end: ``total`` rows, or (no total) the first page shorter than page_size; a page whose
    answer carries ``force_continue`` goes on to the next whatever its length, unless it is 0
    (as /v1 sources use it: one that filters its pages after reading them), up to the total."""
    first = puller.page(0)
    total, step = first.total, puller.step
    if total is not None and total > settings.SOURCE_MAX_ROWS:
        raise SourceFailed(f"the source's total {total} is over SOURCE_MAX_ROWS ({settings.SOURCE_MAX_ROWS})")
    try:
        template = build_template(look, first.rows, first.answer)
    except ValidationError as exc:
        raise SourceFailed(f"the source's first page: {exc}") from None

    def rows() -> Iterator[dict]:
        page, got, number = first, 0, 0
        while True:
            _check_page(page, number, got, total, step)
            yield from page.rows
            got += len(page.rows)
            if _last(page, got, total, step):
                return
            number += 1
            if number > settings.SOURCE_MAX_ROWS // step + 1000:  # empty pages asked for ever
                raise SourceFailed(f"the source kept asking for more after {number} pages")
            if puller.interval > 0:
                time.sleep(puller.interval)
            page = puller.page(number)

    return Pulled(template, total, rows())


def _check_page(page: Page, number: int, got: int, total: int | None, step: int) -> None:
    """SourceFailed when a page breaks the source's word: empty before its total, past its total,
    longer than page_size, or past SOURCE_MAX_ROWS."""
    if total is not None and not page.rows and got < total and page.force_continue is None:
        raise SourceFailed(f"the source ended after {got} rows of the {total} its total promised "
                           f"(page {number} was empty)")
    if total is not None and got + len(page.rows) > total:
        raise SourceFailed(f"the source gave more rows than its total of {total} (page {number})")
    if len(page.rows) > step:
        raise SourceFailed(f"source page {number} has {len(page.rows)} rows, more than page_size {step}")
    if got + len(page.rows) > settings.SOURCE_MAX_ROWS:
        raise SourceFailed(f"the source gave more than SOURCE_MAX_ROWS ({settings.SOURCE_MAX_ROWS}) rows")


def _last(page: Page, got: int, total: int | None, step: int) -> bool:
    """Whether the pull ends after ``page``."""
    if total is not None and got >= total:
        return True
    if page.force_continue is not None:
        return page.force_continue in (0, "0")
    if total is None:
        return len(page.rows) < step
    return False


# --- source_data (rows inline) ----------------------------------------------------------

def inline_tables(data: Any) -> list:
    """source_data as one entry per table: one table's rows (a list of objects, or an object of
    row-leaf name -> rows), or in multi-table mode a list of those."""
    data = _json(data, "source_data")
    if isinstance(data, dict) and isinstance(data.get("data"), (list, dict)) and set(data) <= {
            "data", "total", "header", "footer", "template"}:
        data = data["data"]  # the answer's inner object, as a source_url page gives it
    # multi-table mode: a list of tables, each a list of rows (a list of rows is one table)
    tables = data if isinstance(data, list) and data and all(isinstance(t, list) for t in data) else [data]
    for i, rows in enumerate(tables):
        where = f"source_data[{i}]" if len(tables) > 1 else "source_data"
        if isinstance(rows, dict):
            if not all(isinstance(v, list) and all(isinstance(r, dict) for r in v) for v in rows.values()):
                raise ValidationError(f"{where}: rows keyed by row header must each be a list of objects")
        elif not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ValidationError(f"{where} must be a list of row objects (or, in multi-table mode, "
                                  "a list of such lists)")
    return tables


def write_inline(look: Look, tables: list, fmt: str, out: IO[bytes],
                 wrap: Callable[[Iterator[dict]], Iterator[dict]] | None = None) -> tuple[Template, int]:
    """Write source_data's rows with the download task's look; (template, rows written)."""
    if len(tables) == 1:
        first = tables[0]
        template = build_template(look, first if isinstance(first, list) else None)
    else:
        built = [build_template(look, rows if isinstance(rows, list) else None, None, i, len(tables))
                 for i, rows in enumerate(tables)]
        if any(len(t.tables) != 1 for t in built):
            raise ValidationError("template: in multi-table mode, one table's template per table")
        template = replace(built[0], tables=tuple(t.tables[0] for t in built))
    check_fits(template, fmt)
    remaining = iter(tables)

    def source(table: Table) -> Any:
        rows = next(remaining)
        if isinstance(rows, dict):
            return rows  # keyed by row leaf: the Excel writer buckets it
        return wrap(iter(rows)) if wrap else rows

    n = WRITERS[fmt](template, source, out)
    return template, n


def write_pulled(pulled: Pulled, fmt: str, out: IO[bytes],
                 wrap: Callable[[Iterator[dict]], Iterator[dict]] | None = None) -> int:
    check_fits(pulled.template, fmt)
    rows = wrap(pulled.rows) if wrap else pulled.rows
    return WRITERS[fmt](pulled.template, rows, out)


def parse_task_template(value: Any, tables: int) -> Any:
    """A download task's template parameter checked now (one line if it is not one), kept as data."""
    raw = _json(value, "template")
    if raw in (None, "", [], {}):
        return None
    if tables > 1:
        if not isinstance(raw, list) or len(raw) != tables:
            raise ValidationError(f"template: in multi-table mode a list of {tables} templates")
        for t in raw:
            from_data(_json(t, "template"), general=True)
        return raw
    if isinstance(raw, str):
        parse_template(raw, general=True)
        return raw
    from_data(raw, general=True)
    return raw
