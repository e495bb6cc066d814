"""The audit log: every door records the changes it makes here — jobs, their tasks and
generators, tokens, projects, grants, exports — the CLI as ``cli:<os user>``, the API and console
as the token; admins read it (``downcluster audit``, GET /api/v1/audit).
"""
from __future__ import annotations

import getpass
import logging
from typing import TYPE_CHECKING, Any

from common.store import audit
from common.store.clock import iso, utcnow
from master.views import clamp, object_id

if TYPE_CHECKING:
    from common.store.control import Token

logger = logging.getLogger(__name__)


def _operator() -> str:
    try:
        return "cli:" + getpass.getuser()
    except Exception:  # no user name in this environment (a container without passwd)
        return "cli"


def record(token: Token | None, action: str, target: Any = "", project: int | None = None,
           **detail: Any) -> None:
    """Note that the caller (None: the command line) did ``action`` on ``target``."""
    actor = _operator() if token is None else token.name
    audit.add(utcnow(), actor, None if token is None else token.id, "admin" if token is None else token.role,
              action, str(target), project, {k: v for k, v in detail.items() if v is not None})
    logger.info("audit: %s %s %s", actor, action, target)


def page(limit: Any = None, before: Any = None, action: Any = None) -> dict:
    """Entries newest first; ``next``: the cursor (``before``) of the following page."""
    n = clamp(limit, 50)
    docs = audit.entries(n + 1, object_id(before, "before") if before is not None else None,
                         str(action) if action else None)
    more = len(docs) > n
    docs = docs[:n]
    items = [{"id": str(d.id), "at": iso(d.at), "actor": d.actor,
              "actor_id": str(d.actor_id) if d.actor_id else None, "role": d.role,
              "action": d.action, "target": d.target, "project": d.project,
              "detail": {k: iso(v) for k, v in d.detail.items()}} for d in docs]
    return {"entries": items, "next": items[-1]["id"] if more else None}
