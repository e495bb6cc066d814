"""The documents of the "log" database (``MONGO_LOG_URI``): one record per download, dispatch,
alert, rejected registration, notification delivery and generator run. Written once, read by
time (``_id``) and removed by age (``common/store/retention.py``); the schema's rules are those of
``common.store.models``.
"""
from __future__ import annotations

from mongoengine import DateTimeField, DictField, Document, IntField, ListField, ReferenceField, StringField

from common.store.clock import utcnow
from common.store.models import FAIL, RUN_STATUSES, SUCCESS, CrawlerTask, Job


class CrawlerDownloadLog(Document):
    job = ReferenceField(Job)
    task = ReferenceField(CrawlerTask)
    lease = StringField()
    status = StringField(choices=(SUCCESS, FAIL))
    requests_size = IntField(default=0)
    response_size = IntField(default=0)
    failed_reason = StringField(max_length=10240)
    downloads_hostname = StringField()
    spend_time = IntField(default=0)  # microseconds
    coalesced_from = ReferenceField("CrawlerTask")  # the task whose download this one reused
    not_modified = StringField()  # a revisit that stored nothing: "HTTP 304" or "same content"
    fetched_at = DateTimeField()  # ... and when its fetch began (store's clock): its WARC-Date
    add_datetime = DateTimeField(default=utcnow)
    # no index on add_datetime: the _id (made when the log is written) orders and ranges by time,
    # and on this store each index costs every insert
    meta = {"db_alias": "log", "indexes": ["task", ("job", "_id")]}  # a task's logs; a job's, by time


class CrawlerDispatchAlertLog(Document):
    job = ReferenceField(Job)
    type = StringField(max_length=128)
    reason = StringField(max_length=10240, required=True)
    content_bytes = IntField(default=0)
    hostname = StringField(required=True)
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "log"}


class CrawlerDispatchLog(Document):
    """One record per queue entry a dispatcher run wrote (or failed to write)."""

    job = ReferenceField(Job)
    status = StringField(choices=(SUCCESS, FAIL))
    queue = StringField()
    lease = StringField()
    count = IntField(default=0)
    reason = StringField(max_length=10240)
    hostname = StringField()
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "log"}


class CrawlerRegistrationErrorLog(Document):
    """A rejected ``job register``: nothing else was stored."""

    name = StringField()
    manifest = StringField()
    reason = StringField(max_length=10240, required=True)
    hostname = StringField()
    project = IntField()   # the project it was submitted to (null: an admin's, or older)
    actor = StringField()  # the token's name, or "cli" at the master's command line
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "log", "indexes": [("project", "-_id")]}


class NotificationLog(Document):
    """One delivery attempt of a webhook or mail."""

    target = StringField()
    channel = StringField(db_field="kind")  # webhook, form or mail
    event = StringField()
    status = StringField()                       # SENT or FAIL
    attempt = IntField()
    error = StringField(max_length=2048)
    add_datetime = DateTimeField(default=utcnow)
    meta = {
        "db_alias": "log",
        "collection": "notification_log",
    }  # add_datetime: a TTL index (master/ops/retention.py)


class CrawlerGeneratorLog(Document):
    """One generator run: RUNNING, then SUCCESS or FAIL; SKIPPED when it came due while the
    previous run was still under way. ``errors``: the first rejected lines ({line, reason})."""

    job = ReferenceField(Job)
    run = StringField()
    trigger = StringField()                     # schedule | manual
    status = StringField(choices=RUN_STATUSES)
    added = IntField(default=0)
    duplicate = IntField(default=0)
    rejected = IntField(default=0)
    lines = IntField(default=0)
    errors = ListField(DictField())
    bytes = IntField(default=0)
    spend_time = IntField(default=0)            # microseconds
    hostname = StringField()
    failed_reason = StringField(max_length=10240)
    started_at = DateTimeField()
    finished_at = DateTimeField()
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "log", "collection": "crawler_generator_log", "indexes": [("job", "_id")]}
