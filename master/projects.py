"""Projects: created by an admin (the cluster assigns the id), listed, shown; tokens are granted
projects (``downcluster token grant NAME --project ID``). Who sees what of them: master/access.py."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pymongo.errors import DuplicateKeyError

from common.errors import Conflict, NotFound, ValidationError
from common.store import control, projects
from common.store.clock import iso
from common.store.control_models import DEFAULT_PROJECT
from master import access, audit

if TYPE_CHECKING:
    from common.store.control import Token

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{1,63}$")


def describe(project) -> dict:
    return {"id": project.id, "name": project.name, "allow_private": bool(project.allow_private),
            "created": iso(project.add_datetime)}


def create(name: Any, token: Token | None = None, allow_private: Any = False) -> dict:
    """A new project; ``allow_private``: its download tasks may pull from private addresses (an
    intranet system's source; the cluster's own services never)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValidationError("project name must be 2-64 letters, digits, '_', '.' or '-', "
                              f"starting with a letter or digit, got {str(name)[:70]!r}")
    if not isinstance(allow_private, bool):
        raise ValidationError("allow_private must be true or false")
    try:
        project = projects.add(name, allow_private)
    except DuplicateKeyError:
        raise Conflict(f"a project named {name!r} exists") from None
    audit.record(token, "project.create", project.id, project.id, name=name)
    return describe(project)


def resolve(key: Any, token: Token | None = None) -> int:
    """A project's id from its id or its name, if the caller holds it (else NotFound)."""
    text = str(key)
    if text == DEFAULT_PROJECT:
        projects.default_id()  # made on first use
    found = projects.by_id(int(text)) if text.isdigit() else projects.by_name(text)
    if found is None or not access.holds(token, found.id):
        raise NotFound(f"no project {text[:64]!r}")
    return found.id


def show(key: Any, token: Token | None = None) -> dict:
    return describe(projects.by_id(resolve(key, token)))


def detail(key: Any, token: Token | None = None) -> dict:
    """A project, the names of its jobs and of the tokens that hold it (admins hold all)."""
    project_id = resolve(key, token)
    shown = describe(projects.by_id(project_id))
    shown["jobs"] = sorted(projects.job_names([project_id], projects.default_id()))
    shown["tokens"] = sorted(t.name for t in control.tokens() if project_id in t.projects)
    return shown


def listing(token: Token | None = None) -> list[dict]:
    return [describe(p) for p in projects.listing(access.held(token))]


def grant(name: str, keys: list[Any], remove: bool = False, token: Token | None = None) -> list[int]:
    """Give token NAME these projects (or take them back); its projects after."""
    found = control.token(name)
    if found is None:
        raise NotFound(f"no token named {name!r}")
    ids = [resolve(k) for k in keys] if not remove else [int(k) if str(k).isdigit() else resolve(k)
                                                         for k in keys]
    after = projects.grant(found.id, ids, remove)
    audit.record(token, "token.ungrant" if remove else "token.grant", name, projects=ids)
    return after
