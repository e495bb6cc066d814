"""The download center's calling systems (the callers of its /v1 interface) and their own ids.

A caller is registered by an admin with the ``app_id`` and secret it already signs with
(``downcluster caller add``, ``POST /api/v1/callers``) and the projects it may use; it acts as a
token of role user holding those projects (``caller.<app_id>``), so every access rule of the
cluster applies to it unchanged. Its requests carry ``app_id`` and ``token`` (``wecar_token``
over the other parameters); ``signed`` finds the caller and checks the token. The secret is kept
in the control database, shown once when generated, and never logged.

A caller names projects by strings (the ids the center it used before gave it, or ``POST
/v1/project`` gives): ``center_key`` maps them to the cluster's project numbers; a plain number is
the project of that number.
"""
from __future__ import annotations

import re
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pymongo.errors import DuplicateKeyError

from common.config import settings
from common.errors import Conflict, NotFound, ValidationError
from common.signing import wecar_ok
from common.store import callers as store
from common.store import control, projects
from master import tokens

APP_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")
KEY_PATTERN = r"^[A-Za-z0-9_.:-]*[A-Za-z_.:-][A-Za-z0-9_.:-]*$"  # not a plain number: that is a project's id
KEY_RE = re.compile(KEY_PATTERN)
PREFIX = "caller."  # the name of a caller's token: caller.<app_id>


class Refused(Exception):
    """A signed request refused: ``code`` 300 (no app_id or token, or an unknown app_id) or 301
    (the token does not verify), as the /v1 interface's callers expect them."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Added:
    app_id: str
    projects: list[int]
    secret: str | None   # the generated secret (shown once); None when the admin gave it


def add(app_id: str, project_ids: list[int], secret: str | None = None) -> Added:
    """Register ``app_id`` for ``project_ids`` (which must exist), signing with ``secret`` or a
    new one."""
    if not APP_ID_RE.match(app_id or ""):
        raise ValidationError("app_id must be 1-48 letters, digits, '_', '.' or '-'")
    if secret is not None and not 8 <= len(secret) <= 128:
        raise ValidationError("secret must be 8 to 128 characters")
    missing = [p for p in project_ids if projects.by_id(p) is None]
    if missing:
        raise NotFound(f"no project {missing[0]}")
    if store.exists(app_id):
        raise Conflict(f"caller {app_id!r} exists: remove it first")
    generated = None if secret is not None else secrets.token_hex(16)
    tokens.create(PREFIX + app_id, "user", sorted(set(project_ids)))
    found = control.token(PREFIX + app_id)
    assert found is not None
    if not store.add(app_id, secret or str(generated), found.id):
        control.revoke(found)
        raise Conflict(f"caller {app_id!r} exists: remove it first")
    return Added(app_id, sorted(set(project_ids)), generated)


def remove(app_id: str) -> None:
    token = store.remove(app_id)
    if token is False:
        raise NotFound(f"no caller {app_id!r}")
    if isinstance(token, control.Token):
        control.revoke(token)


def listing() -> list[dict]:
    return [{"app_id": a, "projects": p, "added": at} for a, p, at in store.listing()]


def signed(params: dict[str, Any]) -> control.Token:
    """The caller whose ``app_id`` and ``token`` are in ``params``, its token checked over the
    other parameters; Refused otherwise. The scheme carries no time of its own: a ``timestamp``
    parameter (UNIX seconds, signed with the rest) is held to CENTER_SIGNATURE_WINDOW when a
    caller sends one (docs/exports.md: how replays are bounded without it)."""
    app_id, token = params.get("app_id"), params.get("token")
    if not isinstance(app_id, str) or not app_id or not isinstance(token, str) or not token:
        raise Refused(300, "invalid invoke:no app_id or token.")
    found = store.secret_of(app_id) if APP_ID_RE.match(app_id) else None
    if found is None or found[1] is None:
        raise Refused(300, "invalid invoke:invalid app_id.")
    if not wecar_ok(params, found[0], token):
        raise Refused(301, "invalid invoke:verify token faild.")
    stamp = params.get("timestamp")
    if stamp is not None:  # a caller that signs a time has it held to CENTER_SIGNATURE_WINDOW
        try:
            late = abs(time.time() - float(stamp)) > settings.CENTER_SIGNATURE_WINDOW
        except (TypeError, ValueError):
            late = True
        if late:
            raise Refused(301, "invalid invoke:timestamp outside CENTER_SIGNATURE_WINDOW.")
    return found[1]


# --- the caller's own ids of projects and groups ---------------------------------------------

def project_of(key: Any) -> int:
    """The project a caller's string id names (NotFound if none); a plain number is itself."""
    text = str(key if key is not None else "").strip()
    if re.fullmatch(r"[1-9][0-9]{0,8}", text):
        return int(text)
    found = store.project_of(text) if KEY_RE.match(text) and len(text) <= 80 else None
    if found is None:
        raise NotFound(f"项目{text[:40]}不存在")
    return found


def key_of(project_id: int | None) -> str | None:
    """The string id callers know a project by (its number when it has none)."""
    if project_id is None:
        return None
    return store.key_of(project_id) or str(project_id)


def alias(key: str, project_id: int) -> None:
    """Let callers name project ``project_id`` by ``key`` (the id an earlier center gave them)."""
    if not KEY_RE.match(key or "") or len(key) > 80:
        raise ValidationError("a project key must be 1-80 letters, digits, '_', '.', ':' or '-', "
                              "not a plain number")
    record = projects.by_id(project_id)
    if record is None:
        raise NotFound(f"no project {project_id}")
    if not store.add_key(key, "project", record.name, project_id):
        raise Conflict(f"project key {key!r} or a key of project {record.name!r} exists")


def add_group(name: Any) -> str:
    """A new project group ``name``: its id (ValidationError 505 if the name is taken)."""
    name = _name(name)
    gid = str(uuid.uuid4())
    if not store.add_key(gid, "group", name):
        raise Exists(505, "项目组已经存在")
    return gid


def add_project(name: Any, group_id: Any) -> tuple[str, int]:
    """A new project ``name`` in group ``group_id``: (its string id, its number)."""
    name = _name(name)
    if not isinstance(group_id, str) or not store.is_group(group_id):
        raise Exists(504, "项目组不存在")
    if store.named("project", name) or projects.by_name(name):
        raise Exists(503, "项目已存在")
    try:
        record = projects.add(name)
    except DuplicateKeyError:
        raise Exists(503, "项目已存在") from None
    key = str(uuid.uuid4())
    store.add_key(key, "project", name, record.id, group_id)
    return key, record.id


def _name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= 64:
        raise ValidationError("name must be 1 to 64 characters")
    return name.strip()


class Exists(Exception):
    """A project or group the caller names that exists (or does not): the /v1 codes 503-505."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
