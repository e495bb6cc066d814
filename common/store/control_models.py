"""The documents of the "control" database (``MONGO_CONTROL_URI``), never given to analysts:
projects, the audit log, API tokens (their digests), console sessions and the cluster's
generated secrets; and the roles a token holds. The schema's rules are those of
``common.store.models``.
"""
from __future__ import annotations

from mongoengine import (
    BooleanField,
    DateTimeField,
    DictField,
    Document,
    IntField,
    ListField,
    ObjectIdField,
    StringField,
)

from common.store.clock import utcnow

ADMIN, USER, ANALYST = "admin", "user", "analyst"
ROLES = (ADMIN, USER, ANALYST)
DEFAULT_PROJECT = "default"  # the project of jobs registered before projects


class Project(Document):
    """A team's or system's share of the cluster: its jobs, exports and the tokens granted it.
    The id is assigned by the cluster (1, 2, ...), never chosen by the caller."""

    id = IntField(primary_key=True)
    name = StringField(required=True, unique=True, max_length=64)
    allow_private = BooleanField(default=False)  # its download tasks may pull from private addresses
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "control"}


class AuditEntry(Document):
    """One change made by a person or system: who (the token's name and id, or the command line),
    what (``action``: job.register, token.create, export.retry ...), on what, and when."""

    at = DateTimeField(default=utcnow)
    actor = StringField(required=True)      # a token's name, or "cli:<os user>"
    actor_id = ObjectIdField()              # the token's id (null: the command line)
    role = StringField()
    action = StringField(required=True)
    target = StringField(default="")
    project = IntField()
    detail = DictField()
    meta = {"db_alias": "control", "collection": "audit_log", "indexes": [("-at", "-_id")]}


class ApiToken(Document):
    """A token of the HTTP API and console: only its SHA-256 is stored (shown once at creation)."""

    name = StringField(required=True, unique=True, max_length=64)
    role = StringField(choices=ROLES, required=True)
    digest = StringField(required=True, unique=True)  # hex SHA-256 of the token
    jobs = ListField(StringField())  # an analyst's grants: it sees every export of these jobs
    projects = ListField(IntField())  # the projects it holds (an admin holds every project)
    add_datetime = DateTimeField(default=utcnow)
    last_used_at = DateTimeField()
    meta = {"db_alias": "control"}


class WebSession(Document):
    """A console sign-in: the cookie holds a random secret whose SHA-256 is ``_id``; kept in
    MongoDB so that any web process behind a load balancer knows it and signing out ends it."""

    id = StringField(primary_key=True)
    token = StringField(required=True)  # ApiToken.digest: revoking the token ends its sessions
    csrf = StringField(required=True)
    expires_at = DateTimeField(required=True)
    meta = {"db_alias": "control", "indexes": ["token"]}


class ClusterSecret(Document):
    """Random keys generated once for the cluster when SECRET_KEY / WEBHOOK_SECRET are unset."""

    id = StringField(primary_key=True)
    value = StringField(required=True)
    meta = {"db_alias": "control"}


class CenterCaller(Document):
    """A calling system of the download center's /v1 interface: its ``app_id``, the
    secret it signs with (kept here, in clear, because its md5 signature can only be checked with
    the secret itself; never in the analysts' databases, never logged) and the token whose
    projects and role it acts with."""
    id = StringField(primary_key=True)       # the app_id
    secret = StringField(required=True)
    token = ObjectIdField(required=True)     # ApiToken.id (role user, the caller's projects)
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "control", "collection": "center_caller"}


class CenterKey(Document):
    """A caller's string id of a project or a project group (/v1/project, /v1/group): ``kind``
    project (``project``: our project's number) or group; names unique within their kind."""
    id = StringField(primary_key=True)       # the string the caller sends
    kind = StringField(choices=("project", "group"), required=True)
    name = StringField(required=True, max_length=80)
    project = IntField()                     # kind project: the project it names
    group = StringField()                    # kind project: its group's id
    add_datetime = DateTimeField(default=utcnow)
    meta = {"db_alias": "control", "collection": "center_key",
            "indexes": [{"fields": ["kind", "name"], "unique": True}, "project"]}
