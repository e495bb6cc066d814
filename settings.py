"""downcluster defaults.

Every UPPERCASE name here can be overridden, in increasing precedence, by a local settings
file named in ``DOWNCLUSTER_SETTINGS``, by the environment variable ``DOWNCLUSTER_<NAME>``,
and by a command-line flag where one exists. Read values through ``common.config.settings``.
"""

# --- connections -------------------------------------------------------------------------
REDIS_URL = "redis://127.0.0.1:6379/0"
"""Redis holding the rq queues, the dispatcher lock and download heartbeats."""

MONGO_URI = "mongodb://127.0.0.1:27017/downcluster"
"""MongoDB "source" database (jobs, tasks, stored data); the database name is in the URI."""

MONGO_LOG_URI = "mongodb://127.0.0.1:27017/downcluster_log"
"""MongoDB "log" database (download, dispatch, alert and registration-error logs)."""

MONGO_CONTROL_URI = ""
"""MongoDB "control" database: the cluster's secrets (the generated signing keys), API token
digests and console sessions — the one database analysts are never given. Empty: beside the
source database, on the same server, named after it with ``_control``."""

MONGO_TIMEOUT = 10.0
"""Seconds to wait for MongoDB before a command or API call fails with "MongoDB unreachable"."""

MONGO_SOCKET_TIMEOUT = 300.0
"""Seconds one MongoDB command may wait for its reply before the client gives up on the
connection and the caller retries (a partition that drops packets never closes a socket)."""

SENTRY_DSN = ""
"""Sentry DSN; empty switches Sentry off."""

HOSTNAME = ""
"""This host's name in logs and host queues; empty means the machine's hostname."""

# --- dispatcher ---------------------------------------------------------------
MAX_TOTAL_DISPATCH_COUNT_ONCE = 7000
"""Tasks one dispatcher run may enqueue in all."""

DISPATCH_USE_POOL_TIMEOUT = 300
"""Seconds one dispatcher run may take; past it the run is killed as a whole."""

DISPATCH_LOCK_TTL = 10
"""Seconds the dispatcher lock outlives its holder: renewed every third of it while a dispatcher
runs, so a successor of one that was killed takes over within this."""

DISPATCH_STOP_GRACE = 5.0
"""Seconds ``dispatch --loop`` may take to end after SIGTERM; past them it releases its lock and exits."""

DISPATCH_POOL_SIZE = 4
"""Jobs handled in parallel by one dispatcher run."""

DISPATCH_ORDER = "priority"
"""Order in which jobs draw on the queue caps: "priority", "host" or "priority,host"."""

DISPATCH_BATCH_SIZE = 50
"""Tasks of one job carried by one queue entry; the queue caps count entries."""

DISPATCH_LOOP_INTERVAL = 1.0
"""Seconds between top-ups in ``downcluster dispatch --loop``."""

Q_DOWN_SUPER_LEN = 1000
"""Cap on entries in down_super (and in each host's down_super)."""

Q_DOWN_HIGH_LEN = 1000
"""Cap on entries in down_high (and in each host's down_high)."""

Q_DOWN_MID_LEN = 1000
"""Cap on entries in down_mid (and in each host's down_mid)."""

Q_DOWN_LOW_LEN = 1000
"""Cap on entries in down_low (and in each host's down_low)."""

DEFAULT_DISPATCH_NUM = 100
"""Per-job tasks per dispatcher run when the job's settings do not say."""

DEFAULT_MAX_RETRY_TIMES = 5
"""A FAIL task is re-dispatched while its download_times is below this."""

# --- recovery and retries ----------------------------------------------------------------
MAX_RECOVERIES = 3
"""Times a task may be recovered from a lost queue entry or dead worker before it is DEAD."""

HEARTBEAT_INTERVAL = 5
"""Seconds between a running batch's heartbeats."""

HEARTBEAT_TTL = 20
"""Seconds after the last heartbeat when a running batch counts as dead."""

LEASE_TIMEOUT = 3600
"""Seconds after which a dispatched task is recovered whatever its queue entry says; refused
unless longer than an entry may run (a plain rq worker's, and a ``downcluster worker``'s, whose
tasks may wait at its gate: HOST_WAIT_MAX +
3 x (HOST_WAIT_MAX + DOWNLOAD_TIMEOUT) + 120 s)."""

ABSENCE_GRACE = 10
"""Seconds a QUEUED entry must stay missing from every queue between two looks of the defender
before its tasks are given back: a worker that has just popped it claims it well within this."""

DATA_SWEEP_GRACE = 3600
"""Seconds before the defender removes a data document that no task names (an orphan of a lost
attempt): longer than any write in flight can live (pymongo retries, TCP retransmission)."""

RETRY_BACKOFF_BASE = 2.0
"""Seconds of the first retry delay; it doubles with each attempt."""

RETRY_BACKOFF_MAX = 600.0
"""Longest retry delay in seconds (also caps a server's Retry-After)."""

# --- downloads ---------------------------------------------------------------------------
DOWNLOAD_TIMEOUT = 300
"""Seconds one download may take in all, whatever the downloader type."""

DOWNLOAD_MAXSIZE = 64 * 1024 * 1024
"""Largest body kept, counted after decompression; a larger one fails the download."""

DOWNLOAD_MAX_REDIRECTS = 10
"""Redirects the built-in engine follows before failing."""

DOWNLOAD_CONCURRENCY = 16
"""Threads per worker process for downloads that block: the requests engine and python and
shell downloaders (the built-in aiohttp engine needs none)."""

DOWNLOAD_USER_AGENT = "downcluster/1.0"
"""User-Agent header of the built-in engine."""

SANDBOX_MEMORY_MB = 1024
"""Address-space limit of a python or shell downloader process."""

SANDBOX_CPU_SECONDS = 300
"""CPU-seconds limit of a python or shell downloader process."""

SANDBOX_MAX_PROCESSES = 64
"""Processes a shell downloader may run at once (per uid, where the kernel counts them)."""

SANDBOX_MAX_OPEN_FILES = 256
"""Open files of a python or shell downloader process."""

SANDBOX_MAX_FILE_MB = 64
"""Largest file a python or shell downloader may write."""

SANDBOX_PYTHON = ""
"""Interpreter of python downloaders; empty: this worker's own when every user can read it,
else the system's python3 (the sandbox runs as an unprivileged uid)."""

SANDBOX_STDERR_BYTES = 4096
"""Tail of a downloader's stderr kept as its failure reason."""

SANDBOX_DENY = ""
"""More that python and shell downloaders may not reach, besides the cluster's own services
(Redis, MongoDB, the web, which they never reach): comma-separated CIDRs, hosts (every port)
or host:port, e.g. the address of a web on another host or of an internal service."""

SANDBOX_ALLOW = ""
"""host:port pairs that python and shell downloaders of jobs without ``allow_private`` may
reach although they are on this host or loopback: typically a local forward proxy. The browser
engine's pages of such jobs go by the same rule, and the built-in engines accept these (and only
these) private addresses as such jobs' ``proxy``."""

SERVICES_REFRESH = 60.0
"""Seconds between two looks at where the cluster's services really are (names resolved again,
the Sentinels asked for their masters and replicas, MongoDB's members read from the driver), for
the address guard of the built-in engines and the sandbox wall. A server once seen stays walled."""

GRIDFS_THRESHOLD = 15 * 1024 * 1024
"""A response body is stored in GridFS instead of inside the data document when it and the
request body together are at least this large (the document must stay under 16 MiB)."""

MAX_URL_LENGTH = 8192
"""Longest URL accepted by ``task add``."""

# --- worker ------------------------------------------------------------------------------
WORKER_INFLIGHT = 128
"""Downloads one ``downcluster worker`` process runs at once, never more; it takes the next queue
entry (strict queue order) while fewer than twice as many of its tasks are loaded, so the next
downloads wait in the process, ready as others end."""

WORKER_LARGE_BODIES = 4
"""Bodies over 1 MiB a worker's built-in (aiohttp) engine holds at once, from reading until
stored (the others wait at 1 MiB), so its bodies take at most about WORKER_INFLIGHT x 1 MiB +
WORKER_LARGE_BODIES x DOWNLOAD_MAXSIZE, whatever the pages."""

BROWSER_POOL = 2
"""Headless Chromium browsers per worker process for ``download_engine = "browser"`` (one page
at a time each)."""

BROWSER_MAX_PAGES = 100
"""Pages after which a browser is restarted."""

BROWSER_MEMORY_MB = 512
"""V8 heap limit of a page; a page past it crashes and fails (retried)."""

BROWSER_IDLE_MAX = 5.0
"""Seconds after the load event the browser engine waits, at most, for the network to go idle."""

STORE_FLUSH_BYTES = 8 * 1024 * 1024
"""An entry's downloaded bodies are stored once this many bytes wait (and at its end), so a
worker's memory stays bounded whatever the bodies."""

# --- web console and HTTP API ------------------------------------------------------------
WEB_BIND = "127.0.0.1:8080"
"""host:port of ``downcluster web`` (console under /, API under /api/v1)."""

WEB_SESSION_TTL = 12 * 3600
"""Seconds a console sign-in lasts."""

METRICS_ALLOW = "127.0.0.0/8,::1/128"
"""Networks (comma-separated CIDRs) that may read ``GET /metrics`` without a token; others need
any API token as ``Authorization: Bearer``."""

QUEUE_STALL_ALERT = 900
"""Seconds a queue's oldest entry may wait, with no worker taking from that queue, before the
dispatcher writes a ``queue_stall`` alert and mails the jobs waiting in it; 0: no such alert."""

API_MAX_BODY = 16 * 1024 * 1024
"""Largest request body the API reads (by Content-Length, before reading); larger -> 413."""

API_MAX_LIMIT = 1000
"""Largest ``limit`` of a listing; larger values are clamped to it."""

API_CORS_ORIGINS = ""
"""Comma-separated origins allowed to call the API from a browser; empty: CORS off."""

WEB_COOKIE_SECURE = False
"""Mark the console's session cookie Secure (set it when TLS ends at a reverse proxy)."""

# --- export center and notifications ------------------------------------------------------
SECRET_KEY = ""
"""Key of signed export links (HMAC-SHA256); the same on every web host. Empty: a random key is
generated once and kept in MongoDB (collection cluster_secret)."""

PUBLIC_URL = ""
"""Base of absolute links (signed export URLs); empty: http:// + WEB_BIND."""

DATA_RETENTION_DAYS = 0
"""Days a page's stored data (and its task, once final: SUCCESS, FAIL for good, DEAD, CANCEL) is
kept, by the age of the data (of the task's last change); 0 keeps them for ever (a job's
``data_retention_days`` overrides it). ``downcluster archive`` saves them first if they matter."""

LOG_RETENTION_DAYS = 90
"""Days download logs are kept (a job's ``log_retention_days`` overrides it); 0: for ever."""

EVENT_LOG_RETENTION_DAYS = 90
"""Days dispatch logs, alert logs, registration error logs and notification delivery logs are
kept (MongoDB TTL indexes on ``add_datetime``); 0: for ever."""

NOTIFICATION_RETENTION_DAYS = 30
"""Days a delivered or finally failed webhook or mail is kept; 0: for ever."""

EXPORT_TTL = 7 * 24 * 3600
"""Seconds an export's file is kept after it succeeded; then it is removed and the export EXPIRED."""

EXPORT_MAX_RETRIES = 6
"""Attempts of a failing export before it ends FAIL (6 tries a minute apart)."""

EXPORT_RETRY_DELAY = 60
"""Seconds before a failed export attempt is tried again."""

EXPORT_DEDUP_WINDOW = 600
"""Seconds during which an identical export request returns the earlier SUCCESS export."""

EXPORT_URL_TTL = 300
"""Default lifetime of a signed export link asked for through the API or CLI, in seconds
(a caller may ask for another ``ttl``, up to EXPORT_URL_MAX_TTL)."""

EXPORT_URL_MAX_TTL = 7 * 24 * 3600
"""The longest lifetime a caller may ask of a signed export link, in seconds."""

EXPORT_NOTICE_URL_TTL = 24 * 3600
"""Lifetime of the signed link that an export's webhook and mail carry, in seconds."""

EXPORT_MAX_EXEC_TIME = 3600
"""Seconds an export attempt may run (``max_exec_time``; a request may ask for
another, up to EXPORT_MAX_EXEC_TIME_LIMIT): one RUNNING longer is stopped and retried, even if
its worker still beats."""

EXPORT_MAX_EXEC_TIME_LIMIT = 24 * 3600
"""The longest ``max_exec_time`` a request may ask for, in seconds."""

EXPORT_SYNC_MAX_ROWS = 5000
"""A synchronous download (GET /api/v1/jobs/NAME/export) of at most this many rows is answered at
once; a larger one becomes an asynchronous export (202 and its Location)."""

EXPORT_SYNC_SLOTS = 2
"""Synchronous downloads one web process writes at a time; one more becomes asynchronous."""

WEBHOOK_SECRET = ""
"""Key of the X-Downcluster-Signature header of webhooks; set it, and give it to the receivers
(empty: a random key kept in MongoDB, which receivers do not know)."""

WEBHOOK_MAX_ATTEMPTS = 8
"""Attempts to deliver a webhook or mail before giving up."""

WEBHOOK_ALLOW_PRIVATE = False
"""Allow callbacks to loopback and private addresses (off: server-side request forgery)."""

SOURCE_ALLOW_PRIVATE = False
"""Allow a download task's source_url on loopback and private addresses (intranet sources); the
cluster's own services stay refused whatever this says."""

SOURCE_TIMEOUT = 30.0
"""Seconds one page of a download task's source_url may take, connecting and reading it whole."""

SOURCE_RETRIES = 4
"""Tries at one source page that answers 5xx or 429, times out or is malformed (JSON of the wrong
shape, HTML) before the task fails; the waits between them double from SOURCE_RETRY_DELAY."""

SOURCE_RETRY_DELAY = 1.0
"""Seconds before the second try at a source page (then doubled each time)."""

SOURCE_PAGE_MAX_BYTES = 64 * 1024 * 1024
"""Largest answer one source page may give (a larger one fails the task): bounds a worker's memory."""

SOURCE_MAX_ROWS = 20_000_000
"""Rows one download task may pull from its source_url (a source without end fails the task)."""

SOURCE_DATA_MAX_BYTES = 4 * 1024 * 1024
"""Largest source_data (rows given inline with the task, as JSON text) a download task may carry."""

CENTER_APP_ID = ""
"""The download center's own app id (the /v1 interface's callers know the center by it): its
source pulls carry ``app_id`` and a ``token`` signed with CENTER_APP_SECRET, and so do its form
callbacks (/v1 download tasks). Empty: pulls are unsigned and /v1 callbacks carry no app_id or token."""

CENTER_APP_SECRET = ""
"""The secret of CENTER_APP_ID (give it to the sources and callback receivers that check it)."""

CENTER_SIGNATURE_WINDOW = 300
"""Seconds a signed /v1 request's ``timestamp`` may be from the center's clock, when the caller
sends one (the /v1 signature has no time of its own)."""

CENTER_TASK_RETRIES = 3
"""Runs of a /v1 download task whose source fails (3, as the center its callers used before); the
next run starts CENTER_RETRY_AFTER seconds after the last ended."""

CENTER_RETRY_AFTER = 60
"""Seconds between the runs of a /v1 download task whose source failed (60, as the center its
callers used before)."""

CENTER_TASK_RETENTION_DAYS = 30
"""Days a download task of the center is kept after it ended (failed, cancelled, or expired: a
done task's file goes after EXPORT_TTL); then its document, with the rows it carried inline, is
archived (CENTER_ARCHIVE_DIR) and removed by the defender. 0: kept for ever."""

CENTER_ARCHIVE_DIR = ""
"""Directory the removed download tasks are archived to, one JSON line each, a file a day
(center-YYYY-MM-DD.jsonl); empty: removed without an archive."""

SMTP_URL = ""
"""smtp://[user:pass@]host:port, smtps://..., or smtp://...?starttls=1; empty: mails are not sent."""

MAIL_FROM = "downcluster@localhost"
"""Sender of export and report mails."""

ALERT_MAIL_INTERVAL = 3600
"""Least seconds between two alert mails of one job (DEAD tasks, queue_full)."""

# --- crawl etiquette (cluster-wide, in Redis) ---------------------------------------------
# A site is a URL's host (name:port). HOST_* keep the names operators already set: their host is the site.
HOST_CONCURRENCY = 8
"""Downloads in flight to one site (name:port) from the whole cluster; 0 turns the limit off.
A job's ``host_concurrency`` setting may lower it for its own requests."""

HOST_DELAY = 0.0
"""Least seconds between two request starts to one site, cluster-wide (a job's ``host_delay``
and a robots.txt Crawl-delay may raise it)."""

HOST_SLOT_TTL = 30
"""Seconds a worker's hold on a site slot lasts unless renewed (it renews while downloading): a
dead worker's slots free themselves within this."""

HOST_WAIT_MAX = 10.0
"""Seconds a page waits for its site before it is handed back (due again after the wait; no
attempt counted), so a busy site never idles a worker."""

ROBOTS_TTL = 24 * 3600
"""Seconds a site's robots.txt is kept in Redis before it is fetched again."""

ROBOTS_RETRY = 600
"""Seconds a site whose robots.txt answered 5xx or could not be fetched stays closed before
robots.txt is asked for again."""

COALESCE_WINDOW = 60
"""Seconds in which identical requests (same normalised URL and request settings) of any jobs
are downloaded once (built-in engine); 0 turns coalescing off."""
