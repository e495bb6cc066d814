"""MongoDB documents (mongoengine) of the "source" database (jobs, tasks and their keys, data,
leases, exports, notifications, generators), their indexes and the statuses they hold. The
other two databases, one per connection alias, have modules of their own: "log"
(``common.store.log_models``: download, dispatch, alert, registration error, notification and
generator run logs) and "control" (``common.store.control_models``: projects, the audit log, API
tokens, web sessions, cluster secrets); ``common.store.schema`` lists every class.

Collection names are mongoengine's defaults for the class names unless ``meta`` names them;
analysts query them directly, so field names and status strings are part of the interface (README "Schema").
Hot paths use ``Model._get_collection()`` for bulk writes; the classes define the schema
and the indexes. The store's clock and the text form of a stored time are ``common.store.clock``.
"""
from __future__ import annotations

from mongoengine import (
    BinaryField,
    BooleanField,
    DateTimeField,
    DictField,
    Document,
    FloatField,
    IntField,
    ListField,
    ObjectIdField,
    ReferenceField,
    StringField,
)

from common.queue.names import DEFAULT_PRIORITY, PRIORITIES
from common.store.clock import utcnow

ON, OFF = "ON", "OFF"

# task statuses
LIVE, DISPATCH, SUCCESS, FAIL, CANCEL, DEAD = "LIVE", "DISPATCH", "SUCCESS", "FAIL", "CANCEL", "DEAD"
TASK_STATUSES = (LIVE, DISPATCH, SUCCESS, FAIL, CANCEL, DEAD)


class Job(Document):
    name = StringField(required=True, unique=True, max_length=128)
    status = StringField(choices=(ON, OFF), default=ON)
    priority = IntField(min_value=PRIORITIES[0], max_value=PRIORITIES[-1], default=DEFAULT_PRIORITY)
    worker_host = StringField(db_field="host", default="")  # the worker host whose queues take it ("": any)
    project = IntField()  # the project it belongs to (null: the ``default`` project, before ``migrate``)
    # The fresh-task cursor (see common/store/tasks.py): intake numbers a job's tasks 1, 2, ...
    # (``seq``); the dispatcher has sent out every fresh task with seq <= ``seq_sent``.
    seq_next = IntField(default=0)   # highest seq handed out by intake
    seq_sent = IntField(default=0)   # highest seq the dispatcher sent out
    intake = ListField(DictField())  # reservations still being inserted: {"seq": first, "at": time}
    # revisits: every SUCCESS task due up to (revisit_from, revisit_from_id) was sent (``due_revisits``)
    revisit_from = DateTimeField()
    revisit_from_id = ObjectIdField()
    # revisits turned on: its SUCCESS tasks stored before are made due by the "revisits" chore, in
    # ``_id`` order; every one up to this id was (unset once all were)
    revisit_backlog = ObjectIdField()
    add_datetime = DateTimeField(default=utcnow)
    last_update_datetime = DateTimeField(default=utcnow)
    report_at = DateTimeField()       # report_mails: when the last drain summary went out
    report_counts = DictField()       # report_mails: task counts the last summary reported
    alert_mail_at = DateTimeField()   # report_mails: when the last alert mail went out
    follow = DictField(default=None)  # the [follow] table registration checked (None: follows nothing)
    sitemaps = DictField(default=None)  # the [sitemaps] table registration checked (None: no sitemap)
    meta = {"db_alias": "source", "indexes": [("status", "priority")]}


class CrawlerDownloadType(Document):
    language = StringField(required=True, unique=True)
    is_support = StringField(choices=("support", "unsupport"), default="support")
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "source"}


class CrawlerDownload(Document):
    job = ReferenceField(Job, required=True, unique=True)
    code = StringField(default="")
    types = ReferenceField(CrawlerDownloadType, required=True)
    status = StringField(choices=(ON, OFF), default=ON)
    add_datetime = DateTimeField(default=utcnow)
    last_update_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "source"}


from common.jobsettings import field_args  # noqa: E402


class CrawlerDownloadSetting(Document):
    """A job's settings: the fields of ``common.jobsettings.SETTINGS``, each with the bounds, length and
    default of its declaration there (a test holds the field set equal)."""

    job = ReferenceField(Job, required=True, unique=True)
    dispatch_num = IntField(**field_args("dispatch_num"))
    max_retry_times = IntField(**field_args("max_retry_times"))
    proxy = StringField(**field_args("proxy"))
    cookie = StringField(**field_args("cookie"))
    headers = DictField()
    download_engine = StringField(**field_args("download_engine"))
    download_js = StringField(**field_args("download_js"))
    prior = IntField(**field_args("prior"))
    report_mails = StringField(**field_args("report_mails"))
    host_concurrency = IntField(**field_args("host_concurrency"))  # 0: the cluster's HOST_CONCURRENCY
    host_delay = FloatField(**field_args("host_delay"))  # the stricter of this and HOST_DELAY wins
    obey_robots = BooleanField()  # None: true for the built-in engine
    allow_private = BooleanField(
        **field_args("allow_private")
    )  # downloads may reach loopback/private addresses too, once granted:
    private_grant = StringField()  # who granted it: "project" (opened by an admin) or "admin"; else none
    data_retention_days = IntField(
        **field_args("data_retention_days")
    )  # None: DATA_RETENTION_DAYS; 0: for ever
    log_retention_days = IntField(**field_args("log_retention_days"))  # None: LOG_RETENTION_DAYS; 0: for ever
    revisit = FloatField(**field_args("revisit"))  # seconds; 0: a success is final
    revisit_max = FloatField(**field_args("revisit_max"))  # adaptive ceiling; 0: fixed interval
    last_update_datetime = DateTimeField(default=utcnow)
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "source"}


class CrawlerTask(Document):
    """One URL of one job, numbered ``seq`` within its job by intake.

    A fresh task (``retry_at`` null) goes out once, in a queue entry, without a write of its
    own: it stays LIVE until the worker settles it, and the entry's lease (``crawler_lease``)
    says where it is. A task that goes again (a retry, a recovery, a requeue; ``retry_at`` set)
    is marked DISPATCH with the ``lease`` of its entry. ``retry_at`` is when a FAIL or requeued
    task may go again (null on a FAIL: never)."""

    job = ReferenceField(Job, required=True)
    uri = StringField(required=True)
    seq = IntField()
    status = StringField(choices=TASK_STATUSES, default=LIVE)
    download_times = IntField(default=0)
    recoveries = IntField(default=0)
    host_name = StringField(default="")  # the worker host that must take it ("": any); never a site
    lease = StringField()
    queue = StringField()
    dispatched_at = DateTimeField()
    retry_at = DateTimeField()
    failed_reason = StringField()
    data_lease = StringField()  # on SUCCESS: the lease of its crawler_download_data document
    # revisits (a job with ``revisit``): a SUCCESS task is due again at ``retry_at``
    history = ListField(StringField())  # leases of its earlier versions, oldest first
    versions = IntField()          # versions of its page stored (the latest is ``data_lease``'s)
    visits = IntField()            # successful visits, those answered "not modified" included
    not_modified = IntField()      # visits answered 304 or with the same body: nothing stored
    revisit_every = FloatField()   # seconds until its next visit (adaptive: moves each visit)
    changed_at = DateTimeField()   # when a visit last brought new content
    etag = StringField()           # validators of the latest version, sent on the next visit
    last_modified = StringField()
    digest = StringField()         # SHA-256 of the latest version's body
    # following links (a job with [follow]): a found URL's depth (a seed has none: 0) and the task
    # whose page it was found on
    depth = IntField()
    parent = ObjectIdField()
    # a job with [sitemaps]: "xml" for a sitemap (its depth: the indexes that led to it), "robots"
    # for a robots.txt read for its Sitemap: lines; absent for a page
    sitemap = StringField()
    add_datetime = DateTimeField(default=utcnow)
    last_update_datetime = DateTimeField(default=utcnow)
    meta = {
        "db_alias": "source",
        # no unique (job, uri): a URL is a task of its job once by its key (``CrawlerTaskKey``),
        # which settles never touch (on the embedded store every update rewrites every index)
        "indexes": [
            # fresh selection (job, LIVE, null, seq range), retry selection (job, FAIL, <= now)
            ("job", "status", "retry_at", "seq"),
            # a job's tasks of one status in _id order (pages, reports, cancel/requeue, and
            # retention: a task changed before T was made before T)
            ("job", "status", "_id"),
            ("job", "_id"),  # a job's tasks in _id order (pages)
        ],
    }


class CrawlerTaskKey(Document):
    """A URL of a job that has a task: ``_id`` is the job's id (24 hex digits) followed by the URL
    (``common.store.tasks.key_of``), ``task`` the task's id. Written by intake only, before the
    task; removed after it (``common/store/tasks.py``)."""

    id = StringField(primary_key=True)
    task = ObjectIdField(required=True)
    meta = {"db_alias": "source", "collection": "crawler_task_key"}


class CrawlerTaskCount(Document):
    """A job's tasks per status, kept as they change (``common/store/counts.py``)."""

    id = ObjectIdField(primary_key=True)  # the job
    LIVE = IntField(default=0)
    DISPATCH = IntField(default=0)
    SUCCESS = IntField(default=0)
    FAIL = IntField(default=0)
    CANCEL = IntField(default=0)
    DEAD = IntField(default=0)
    first = ObjectIdField()  # no task, data or log of the job was made before (common.store.paging)
    last = ObjectIdField()   # ... nor after
    # by status: no task of the job in it has an _id below floor while floor_ok (common.store.floors)
    floor = DictField()
    floor_ok = DictField()
    floor_v = DictField()    # each floor's version, for the compare-and-set that raises it
    meta = {"db_alias": "source", "collection": "crawler_task_count"}


QUEUED, RUNNING, LOST = "QUEUED", "RUNNING", "LOST"
# an entry of fresh tasks (still LIVE), of tasks sent again (DISPATCH), or of revisits (still SUCCESS)
FRESH, AGAIN, REVISIT = "FRESH", "AGAIN", "REVISIT"

class CrawlerLease(Document):
    """The lease of one queue entry (rq job ``dc-<_id>``): the tasks it carries, from enqueue
    to settle. Its whole life is ``common/store/leases.py``, the fence ``common/store/orphans.py``."""

    id = StringField(primary_key=True)
    job = ReferenceField(Job, required=True)
    queue = StringField(required=True)
    attempt_kind = StringField(db_field="kind", choices=(FRESH, AGAIN, REVISIT), required=True)
    ids = ListField(ObjectIdField())
    uris = ListField(StringField())   # the tasks' URLs, in ``ids`` order (the worker reads no task)
    attempts = ListField(IntField())  # their download_times when sent
    prev = ListField(DictField())     # revisits: each task's latest version (``common.store.records.Prev``)
    sitemaps = ListField(ListField())  # [sitemaps]: each sitemap task's [sitemap, depth] ([]: a page)
    depths = ListField(IntField())    # each task's depth, when any was found on a page (else none)
    state = StringField(choices=(QUEUED, RUNNING, LOST), default=QUEUED)
    worker = StringField()
    hostname = StringField()
    created_at = DateTimeField(default=utcnow)
    started_at = DateTimeField()
    beat_at = DateTimeField()
    lost_reason = StringField()
    missing_at = DateTimeField()      # QUEUED: when the defender first found its entry in no queue
    meta = {"db_alias": "source", "indexes": [("state", "beat_at")]}


class LostLease(Document):
    """A tombstone: a lease that was given back by the defender or had a settle refused (its data
    may have orphans), written before the lease ends and kept (a few a day). Readers check the
    data of such leases document by document (``common.store.fence.shown``); the orphan sweep looks
    among the data it stored for ``ids`` (``common.store.orphans.sweep_orphans``)."""

    id = StringField(primary_key=True)
    job = ObjectIdField()
    reason = StringField()
    at = DateTimeField()
    ids = ListField(ObjectIdField())
    swept = DateTimeField()
    meta = {"db_alias": "source", "collection": "crawler_lease_lost"}


class DefenderState(Document):
    """When each chore is next due (``chore:<name>``: ``at``, master/maintenance.py)."""

    id = StringField(primary_key=True)
    at = DateTimeField()
    meta = {"db_alias": "source", "collection": "defender_state"}


class CrawlerDownloadData(Document):
    """A successful attempt's response. It counts only while its task names it (task
    ``data_lease`` = ``lease``); see the fence in ``common/store/orphans.py``."""

    job = ReferenceField(Job, required=True)
    downloader = ReferenceField(CrawlerDownload)
    task = ReferenceField(CrawlerTask, required=True)
    lease = StringField(required=True)
    url = StringField()
    status_code = IntField()
    requests_headers = DictField()
    response_headers = DictField()
    requests_body = BinaryField()
    response_body = BinaryField()
    response_body_gridfs = ObjectIdField()
    encoding = StringField()
    hostname = StringField()
    remote_ip = StringField()
    version = IntField()          # revisits: 1, 2, ... the page's versions in order
    superseded = BooleanField()   # revisits: a later version of the page is stored (and named)
    fetched_at = DateTimeField()  # when its fetch started (absent before 2026-11-27: add_datetime)
    add_datetime = DateTimeField(default=utcnow)
    meta = {
        "db_alias": "source",
        # one document per page version (a task's, or a revisited page's ``version``): a lost
        # attempt's late insert is refused (``common.store.attempts``); also finds an attempt's
        # data by task, then lease
        "indexes": [{"fields": ("task", "version"), "unique": True}, ("job", "_id")],
    }


class CrawlerOldVersion(Document):
    """An earlier version of a revisited page (its data document is the task's ``lease``), listed
    when a newer one was named, ``_id`` made then: what the data retention removes, oldest first,
    without reading the job's latest versions (``common.store.retention.remove_old_versions``)."""

    job = ObjectIdField(required=True)
    task = ObjectIdField(required=True)
    lease = StringField(required=True)
    meta = {"db_alias": "source", "collection": "crawler_old_version", "indexes": [("job", "_id")]}


# export states
PENDING, EXPORT_RUNNING, CANCELLED, EXPIRED = "PENDING", "RUNNING", "CANCEL", "EXPIRED"
EXPORT_STATES = (PENDING, EXPORT_RUNNING, SUCCESS, FAIL, CANCELLED, EXPIRED)
EXPORT_FORMATS = ("csv", "jsonl", "xlsx", "warc")


class Export(Document):
    """An asynchronous export of a job's data: PENDING -> RUNNING -> SUCCESS | FAIL | CANCEL,
    and EXPIRED once its file (GridFS bucket ``export_fs``, id ``file_id``) is removed."""

    job = ReferenceField(Job)                     # None for a download task (``center``)
    job_name = StringField(default="")
    format = StringField(choices=EXPORT_FORMATS, required=True)
    # a download task of the general download center: its parameters (the source_url or
    # source_data, name, file_name, step, operator/merchant, title, summary, header, footer,
    # widths); its rows come from there, not from a job's data (its project: ``project``)
    center = DictField()
    template = StringField(default="")           # TOML text as requested ("" = every field, flat)
    filter = DictField()                         # {"status": [codes], "since": datetime, "until": datetime}
    digest = StringField(required=True)          # MD5 of the canonical (job, format, template, filter)
    callback_urls = ListField(StringField())
    mails = ListField(StringField())
    requested_by = StringField(default="")         # who asked, as shown: a token's name at the time, or "cli"
    owner = ObjectIdField()                       # the requesting token's id (None: the command line)
    project = IntField()                          # its job's project when requested
    state = StringField(choices=EXPORT_STATES, default=PENDING)
    rows_done = IntField(default=0)
    rows_total = IntField()
    bytes = IntField(default=0)
    attempts = IntField(default=0)               # attempts that ran (failed ones are retried)
    recoveries = IntField(default=0)             # attempts whose worker died
    error = StringField()
    retry_at = DateTimeField()                   # PENDING: not before then
    queued_at = DateTimeField()                  # PENDING: when its down_export entry was pushed
    file_id = ObjectIdField()                    # the GridFS file being or been written
    worker = StringField()
    beat_at = DateTimeField()
    max_exec_time = IntField()                   # seconds an attempt may run (None: EXPORT_MAX_EXEC_TIME)
    deadline_at = DateTimeField()                # RUNNING: stopped and retried after then
    created_at = DateTimeField(default=utcnow)
    started_at = DateTimeField()
    finished_at = DateTimeField()
    expires_at = DateTimeField()
    meta = {
        "db_alias": "source",
        "indexes": [
            ("digest", "created_at"),
            ("state", "retry_at"),
            ("job_name", "-created_at"),
            ("requested_by", "-created_at"),
            ("owner", "-created_at"),
            ("project", "-created_at"),
        ],
    }


class Notification(Document):
    """A webhook or mail to deliver; retried with backoff until delivered or out of attempts."""

    # how it goes (form: a /v1 download task's callback)
    channel = StringField(db_field="kind", choices=("webhook", "form", "mail"), required=True)
    target = StringField(required=True)          # URL or address
    event = StringField(required=True)           # export.succeeded, export.failed, job.report, job.alert
    subject = StringField(default="")
    body = StringField(default="")               # JSON text (webhook), urlencoded (form) or text (mail)
    state = StringField(choices=(PENDING, SUCCESS, FAIL), default=PENDING)
    attempts = IntField(default=0)
    next_at = DateTimeField(default=utcnow)
    worker = StringField()                       # the claim (common/store/claims.py): its holder
    beat_at = DateTimeField()                    # ... and its last beat
    recoveries = IntField(default=0)             # claims taken back from a dead deliverer
    last_error = StringField()
    created_at = DateTimeField(default=utcnow)
    meta = {"db_alias": "source", "indexes": [("state", "next_at")]}


# generator states and run statuses (common/store/generators.py)
GEN_TEST, GEN_ON, GEN_OFF = "test", "on", "off"
GENERATOR_STATES = (GEN_TEST, GEN_ON, GEN_OFF)
GENERATOR_TYPES = ("python", "shell")
RUN_RUNNING, RUN_SKIPPED = "RUNNING", "SKIPPED"
RUN_STATUSES = (RUN_RUNNING, SUCCESS, FAIL, RUN_SKIPPED)


class CrawlerGenerator(Document):
    """A job's generator: code that produces its URLs on a schedule (``common/store/generators.py``).
    ``state`` is test until a dry run of the current ``digest`` passed (``tested_digest``), then on
    or off; ``next_at`` is when it is next due (store's clock), moved by compare-and-set when a
    dispatcher reserves a run; ``running_run`` is the run under way (its log's ``_id``), if any,
claimed by its worker (``beat_at``) once it starts."""

    job = ReferenceField(Job, required=True, unique=True)
    type = StringField(choices=GENERATOR_TYPES, required=True)
    code = StringField(required=True)
    schedule = StringField(required=True)
    schemes = ListField(StringField())
    state = StringField(choices=GENERATOR_STATES, default=GEN_TEST)
    digest = StringField(required=True)         # SHA-256 of type, schedule and code
    tested_digest = StringField()               # the digest of the last passing dry run
    next_at = DateTimeField()
    running_run = StringField()
    running_since = DateTimeField()
    beat_at = DateTimeField()                   # the run's claim (common/store/claims.py): last beat
    recoveries = IntField(default=0)            # runs given up after their worker died
    last_run_at = DateTimeField()
    last_status = StringField()
    add_datetime = DateTimeField(default=utcnow)
    last_update_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "source", "collection": "crawler_generator", "indexes": [("state", "next_at")]}
