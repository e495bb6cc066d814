"""The store's records: each stored thing as a typed, frozen value, converted to and from its
MongoDB document here and nowhere else (``from_doc`` / ``to_doc``), as rq keeps a job's hash in
``Job.to_dict`` / ``Job.restore``. Store functions take and return these; no module outside
``common/store/`` names a field of a document (``tests/unit/test_store_fields.py``).

An attribute is its document's field of the same name (``id`` is ``_id``; one whose name says
more than its field's names the field in its metadata, ``db_field``, as mongoengine does); a field a document
lacks or holds null (an older document, or a read that projects it out) takes the attribute's
default, the model's default where ``common/store/models.py`` declares one. ``Mapping`` and ``Sequence``
attributes hold what the driver read (not copied: a record is built thousands of times a second
on the worker's hot path, see ``docs/layout.md``).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Callable, ClassVar, TypeVar

from bson import ObjectId

from common.queue.names import DEFAULT_PRIORITY


class _Empty(Mapping[str, Any]):
    """The empty mapping a missing mapping field reads as: immutable, so one may be shared
    (hashable, so a dataclass takes it as a default)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0


EMPTY: Mapping[str, Any] = _Empty()
R = TypeVar("R", bound="Record")


class Record:
    """The conversions every record shares; ``_spec`` is (document key, default) per attribute,
    in the order of the dataclass's fields (set once below)."""

    __slots__ = ()
    _spec: ClassVar[tuple[tuple[str, Any], ...]] = ()
    _attrs: ClassVar[tuple[str, ...]] = ()
    _from_doc: ClassVar[Callable[[Mapping[str, Any]], Any]]  # made below from _spec, per record

    @classmethod
    def from_doc(cls: type[R], doc: Mapping[str, Any]) -> R:
        """The record of a document read from MongoDB (a projection: the rest takes defaults)."""
        made: R = cls._from_doc(doc)
        return made

    @classmethod
    def maybe(cls: type[R], doc: Mapping[str, Any] | None) -> R | None:
        """``from_doc``, or None for no document."""
        return None if doc is None else cls.from_doc(doc)

    def to_doc(self) -> dict[str, Any]:
        """The document to store: every attribute that is not None (None: the field is absent)."""
        return {key: value for (key, _), attr in zip(self._spec, self._attrs)
                if (value := getattr(self, attr)) is not None}


@dataclass(frozen=True, slots=True)
class Job(Record):
    """A downloader job (``job``): its queue level, worker host, project, the fresh-task cursor (``seq_next``,
    ``seq_sent``, ``intake``), the revisit cursor and its report marks."""

    id: ObjectId
    name: str
    status: str = "ON"
    priority: int = DEFAULT_PRIORITY
    worker_host: str = field(default="", metadata={"db_field": "host"})  # a machine of workers, never a site
    project: int | None = None
    seq_next: int = 0
    seq_sent: int = 0
    intake: Sequence[Mapping[str, Any]] = ()
    revisit_from: datetime | None = None
    revisit_from_id: ObjectId | None = None
    revisit_backlog: ObjectId | None = None  # revisits turned on: its stored pages made due from here
    follow: Mapping[str, Any] | None = None  # the checked [follow] table (None: follows nothing)
    sitemaps: Mapping[str, Any] | None = None  # the checked [sitemaps] table (None: no sitemap)
    add_datetime: datetime | None = None
    last_update_datetime: datetime | None = None
    report_at: datetime | None = None
    report_counts: Mapping[str, Any] | None = None  # None: no summary sent yet (compared as stored)
    alert_mail_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class JobSettings(Record):
    """A job's settings (``crawler_download_setting``): each field of ``common.jobsettings.SETTINGS``; None
    where the document does not set it (the cluster's default applies)."""

    id: ObjectId
    job: ObjectId
    dispatch_num: int | None = None
    max_retry_times: int | None = None
    proxy: str | None = None
    cookie: str | None = None
    headers: Mapping[str, Any] = EMPTY
    download_engine: str | None = None
    download_js: str | None = None
    prior: int | None = None
    report_mails: str | None = None
    host_concurrency: int | None = None
    host_delay: float | None = None
    obey_robots: bool | None = None
    allow_private: bool | None = None
    private_grant: str | None = None  # who granted allow_private ("project", "admin"); none: no reach
    data_retention_days: int | None = None
    log_retention_days: int | None = None
    revisit: float | None = None
    revisit_max: float | None = None
    last_update_datetime: datetime | None = None
    add_datetime: datetime | None = None


    def by_name(self) -> dict[str, Any]:
        """The settings of ``common.jobsettings.SETTINGS``, by name (what a python downloader is
        given as its ``settings``)."""
        from common.jobsettings import SETTING_NAMES

        values = {name: getattr(self, name) for name in SETTING_NAMES if name in self._attrs}
        return {name: dict(v) if isinstance(v, Mapping) else v for name, v in values.items()}

    def resolved(self, cluster: Any) -> JobSettings:
        """The same with every setting left unset (missing, null or "") at its default, the one
        declared in ``common.jobsettings`` (the cluster's own where it names one)."""
        from common.jobsettings import resolved

        given = resolved(self.by_name(), cluster)
        return replace(self, **{name: value for name, value in given.items() if name in self._attrs})


@dataclass(frozen=True, slots=True)
class Task(Record):
    """One URL of one job (``crawler_task``): its status, attempts, lease and, for revisits, its latest
    version."""

    id: ObjectId
    job: ObjectId
    uri: str
    seq: int | None = None
    status: str = "LIVE"
    download_times: int = 0
    recoveries: int = 0
    host_name: str = ""  # the worker host (its name, shown as is in pages and the archive); never a site
    lease: str | None = None
    queue: str | None = None
    dispatched_at: datetime | None = None
    retry_at: datetime | None = None
    failed_reason: str | None = None
    data_lease: str | None = None
    history: Sequence[str] = ()
    versions: int | None = None
    visits: int | None = None
    not_modified: int | None = None
    revisit_every: float | None = None
    changed_at: datetime | None = None
    etag: str | None = None
    last_modified: str | None = None
    digest: str | None = None
    depth: int | None = None  # a URL found on a page: its depth (a seed has none: 0)
    parent: ObjectId | None = None  # ... and the task whose page it was found on
    sitemap: str | None = None  # "xml": a sitemap, "robots": a robots.txt read for its sitemaps
    add_datetime: datetime | None = None
    last_update_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class Lease(Record):
    """A queue entry's hold on its tasks (``crawler_lease``), from enqueue to settle."""

    id: str
    job: ObjectId
    queue: str
    attempt_kind: str = field(metadata={"db_field": "kind"})  # FRESH, AGAIN or REVISIT (common.store.leases)
    ids: Sequence[ObjectId] = ()
    uris: Sequence[str] = ()
    attempts: Sequence[int] = ()
    prev: Sequence[Mapping[str, Any]] | None = None  # revisits: each task's ``Prev`` ({}: a first visit)
    sitemaps: Sequence[Sequence[Any]] | None = None  # each sitemap task's [sitemap, depth] ([]: a page)
    depths: Sequence[int] | None = None  # each task's depth, when any was found on a page (else None)
    state: str = "QUEUED"
    worker: str | None = None
    hostname: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    beat_at: datetime | None = None
    lost_reason: str | None = None
    missing_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Prev(Record):
    """A stored page's latest version as its next visit needs it (its task's ``data_lease``, the
    validators, digest, version count and interval), copied from the task into its entry's lease
    (``common.store.due.prev_of``)."""

    data_lease: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    digest: str | None = None
    versions: int | None = None
    revisit_every: float | None = None


@dataclass(frozen=True, slots=True)
class LeaseTask:
    """One task as its entry's lease carries it, what a worker downloads (it reads no task):
    ``attempts`` is its ``download_times`` when sent, ``prev`` its page's latest version (a visit
    of a stored page)."""

    id: ObjectId
    uri: str
    attempts: int = 0
    prev: Prev | None = None
    sitemap: tuple[str, int] | None = None  # a sitemap task: (its ``sitemap``, depth); None: a page
    depth: int | None = None  # its depth as the lease carries it (None: not carried, read from the task)


@dataclass(frozen=True, slots=True)
class DataDoc(Record):
    """A successful attempt's response (``crawler_download_data``)."""

    id: ObjectId
    job: ObjectId
    task: ObjectId
    lease: str
    downloader: ObjectId | None = None
    url: str | None = None
    status_code: int | None = None
    requests_headers: Mapping[str, Any] = EMPTY
    response_headers: Mapping[str, Any] = EMPTY
    requests_body: bytes | None = None
    response_body: bytes | None = None
    response_body_gridfs: ObjectId | None = None
    encoding: str | None = None
    hostname: str | None = None
    remote_ip: str | None = None
    version: int | None = None
    superseded: bool | None = None
    fetched_at: datetime | None = None  # when its fetch started (None before 2026-11-27)
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class ExportRecord(Record):
    """An export of a job's data, or a download task of the general center (``export``)."""

    id: ObjectId
    format: str
    digest: str
    job: ObjectId | None = None
    job_name: str = ""
    center: DownloadTaskParams | None = None  # a download task's parameters (stored: {} for a job's export)
    template: str = ""
    filter: Mapping[str, Any] = EMPTY
    callback_urls: Sequence[str] = ()
    mails: Sequence[str] = ()
    requested_by: str = ""
    owner: ObjectId | None = None
    project: int | None = None
    state: str = "PENDING"
    rows_done: int = 0
    rows_total: int | None = None
    bytes: int = 0
    attempts: int = 0
    recoveries: int = 0
    error: str | None = None
    retry_at: datetime | None = None
    queued_at: datetime | None = None
    file_id: ObjectId | None = None
    worker: str | None = None
    beat_at: datetime | None = None
    max_exec_time: int | None = None
    deadline_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    expires_at: datetime | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> ExportRecord:
        """The record of a document, its ``center`` read as a download task's parameters."""
        made: ExportRecord = cls._from_doc(doc)
        raw = doc.get("center")
        object.__setattr__(made, "center", DownloadTaskParams.from_doc(raw) if raw else None)
        return made

    def to_doc(self) -> dict[str, Any]:
        """The document to store, ``center`` in its place: the parameters' document, {} for an
        export of a job (as every export has been stored)."""
        center = {} if self.center is None else self.center.to_doc()
        return {key: center if attr == "center" else value for (key, _), attr in zip(self._spec, self._attrs)
                if attr == "center" or (value := getattr(self, attr)) is not None}

    def rows_filter(self) -> ExportFilter:
        """Its ``filter`` as a record."""
        return ExportFilter.from_doc(self.filter)


@dataclass(frozen=True, slots=True)
class Generator(Record):
    """A job's generator (``crawler_generator``): its code, schedule, state and the run under way."""

    id: ObjectId
    job: ObjectId
    type: str
    code: str
    schedule: str
    digest: str
    schemes: Sequence[str] = ()
    state: str = "test"
    tested_digest: str | None = None
    next_at: datetime | None = None
    running_run: str | None = None
    running_since: datetime | None = None
    beat_at: datetime | None = None  # the run's claim (common/store/claims.py): its last beat
    recoveries: int = 0
    last_run_at: datetime | None = None
    last_status: str | None = None
    add_datetime: datetime | None = None
    last_update_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class NotificationRecord(Record):
    """A webhook or mail of the outbox (``notification``)."""

    id: ObjectId
    channel: str = field(metadata={"db_field": "kind"})  # webhook, form or mail
    target: str
    event: str
    subject: str = ""
    body: str = ""
    state: str = "PENDING"
    attempts: int = 0
    next_at: datetime | None = None
    worker: str | None = None
    beat_at: datetime | None = None
    recoveries: int = 0
    last_error: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Token(Record):
    """An API token (``api_token``, control database): only its SHA-256 is stored."""

    id: ObjectId
    name: str
    role: str
    digest: str
    jobs: Sequence[str] = ()
    projects: Sequence[int] = ()
    add_datetime: datetime | None = None
    last_used_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Project(Record):
    """A project (``project``, control database)."""

    id: int
    name: str
    allow_private: bool = False
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry(Record):
    """One change in the audit log (``audit_log``, control database)."""

    id: ObjectId
    actor: str
    action: str
    at: datetime | None = None
    actor_id: ObjectId | None = None
    role: str | None = None
    target: str = ""
    project: int | None = None
    detail: Mapping[str, Any] = EMPTY


@dataclass(frozen=True, slots=True)
class DownloadType(Record):
    """A downloader language (``crawler_download_type``) and whether it is supported."""

    id: ObjectId
    language: str
    is_support: str = "support"
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class Session(Record):
    """A console sign-in (``web_session``, control database): ``id`` is the SHA-256 of the
    cookie's secret, ``token`` the digest of the token it signed in with."""

    id: str
    token: str = ""
    csrf: str = ""
    expires_at: datetime = datetime.min  # none stored: expired


@dataclass(frozen=True, slots=True)
class ExportFilter:
    """Which data an export takes (an export's ``filter``): the HTTP status codes (none: all),
    stored from ``since`` until ``until`` (naive UTC), every stored version of a page or only its
    latest. Built from a request by ``master.exports.service.check_filter`` alone."""

    status: tuple[int, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    all_versions: bool = False

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> ExportFilter:
        doc = doc or {}
        return cls(tuple(doc.get("status") or ()), doc.get("since"), doc.get("until"),
                   doc.get("versions") == "all")

    def to_doc(self) -> dict[str, Any]:
        """The stored form: only what narrows (``versions`` only when "all")."""
        doc: dict[str, Any] = {}
        if self.status:
            doc["status"] = list(self.status)
        if self.since:
            doc["since"] = self.since
        if self.until:
            doc["until"] = self.until
        if self.all_versions:
            doc["versions"] = "all"
        return doc

    @property
    def narrows(self) -> bool:
        """Whether it keeps fewer documents than the job holds (by code or by time)."""
        return bool(self.status or self.since or self.until)


NO_FILTER = ExportFilter()  # every document of the job, each page's latest version

Pairs = tuple[tuple[Any, Any], ...]  # a header's or footer's (key, value) lines


@dataclass(frozen=True, slots=True)
class DownloadTaskParams:
    """A download task's parameters (an export's ``center`` document), checked by
    ``master.center.params.check``: what it is called, where its rows come from (``source_url``
    or ``source_data``, exactly one), how its file looks (one entry per table of ``title`` ..
    ``footer``), and what the /v1 interface keeps beside them (``v1`` and after). ``to_doc``
    writes the keys in the order they have always been stored, so a document made now is the
    same, byte for byte, as one made before the record existed."""

    name: str = ""
    file_name: str = ""
    step: int = 1000                       # rows a page of source_url
    operator_id: str | None = None
    merchant_type: int | None = None
    merchant_id: int | None = None
    source_url: str | None = None
    source_data: str | None = None         # JSON text (absent in a listing: the store leaves it out)
    tables: int = 1
    template: str | None = None            # JSON or TOML text
    title: tuple[str | None, ...] = ()
    summary: tuple[str | None, ...] = ()
    header: tuple[Pairs | None, ...] = ()
    footer: tuple[Pairs | None, ...] = ()
    default_width: float | None = None
    default_height: float | None = None
    v1: bool = False                       # delivered through the /v1 interface
    interval: int | None = None            # /v1: milliseconds between pages
    rowoffset: int | None = None           # /v1: empty rows above the table
    col_align: str | None = None
    header_align: str | None = None
    footer_align: str | None = None
    keys_header: bool = False              # /v1 CSV: the header is the rows' keys

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> DownloadTaskParams:
        get = doc.get

        def each(key: str) -> tuple[Any, ...]:
            return tuple(get(key) or ())

        def pairs(key: str) -> tuple[Pairs | None, ...]:
            return tuple(None if p is None else tuple(tuple(x) for x in p) for p in each(key))

        return cls(get("name") or "", get("file_name") or "", get("step") or 1000, get("operator_id"),
                   get("merchant_type"), get("merchant_id"), get("source_url"), get("source_data"),
                   get("tables") or 1, get("template"), each("title"), each("summary"), pairs("header"),
                   pairs("footer"), get("default_width"), get("default_height"), bool(get("v1")),
                   get("interval"), get("rowoffset"), get("col_align"), get("header_align"),
                   get("footer_align"), bool(get("keys_header")))

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "file_name": self.file_name, "step": self.step,
                               "operator_id": self.operator_id, "merchant_type": self.merchant_type,
                               "merchant_id": self.merchant_id}
        if self.source_data is not None:
            doc["source_data"] = self.source_data
        if self.source_url is not None:
            doc["source_url"] = self.source_url
        doc |= {"tables": self.tables, "template": self.template, "title": list(self.title),
                "summary": list(self.summary), "header": _pairs_doc(self.header),
                "footer": _pairs_doc(self.footer), "default_width": self.default_width,
                "default_height": self.default_height}
        if self.v1:
            doc |= {"v1": True, "interval": self.interval, "rowoffset": self.rowoffset}
        for key, value in (("col_align", self.col_align), ("header_align", self.header_align),
                           ("footer_align", self.footer_align)):
            if value is not None:
                doc[key] = value
        if self.keys_header:
            doc["keys_header"] = True
        return doc


def _pairs_doc(each: tuple[Pairs | None, ...]) -> list[list[list[Any]] | None]:
    return [None if p is None else [list(x) for x in p] for p in each]

def _fast_from_doc(cls: type[Record]) -> Callable[[Mapping[str, Any]], Any]:
    """``from_doc`` for ``cls`` written out field by field, setting each slot through its
    descriptor, where a frozen dataclass's ``__init__`` sets each through ``object.__setattr__``
    (the costs of both: docs/layout.md): the worker makes records of every task it settles."""
    names: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = ["def from_doc(doc):", "    get = doc.get", "    made = new(cls)"]
    for i, ((key, default), attr) in enumerate(zip(cls._spec, cls._attrs)):
        names[f"set{i}"], names[f"default{i}"] = getattr(cls, attr).__set__, default
        lines += [f"    value = get({key!r})", f"    set{i}(made, default{i} if value is None else value)"]
    exec("\n".join([*lines, "    return made"]), names)  # our own text, made from the fields above
    made: Callable[[Mapping[str, Any]], Any] = names["from_doc"]
    return made


def generated() -> None:
    """Give each record defined so far (a subclass of ``Record``) its conversions, made once from
    its fields: every module of records calls it after its last record."""
    for cls in Record.__subclasses__():
        if "_from_doc" in cls.__dict__ or "__slots__" not in cls.__dict__:
            continue  # done, or the class a slotted dataclass was made from (not the record)
        cls._attrs = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
        cls._spec = tuple((f.metadata.get("db_field") or ("_id" if f.name == "id" else f.name),
                           None if f.default is MISSING else f.default)
                          for f in fields(cls))  # type: ignore[arg-type]
        cls._from_doc = staticmethod(_fast_from_doc(cls))


generated()
