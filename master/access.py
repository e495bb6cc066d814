"""Who may see and do what: projects and roles, decided here for every door (API, console,
WebSocket, metrics, the export center).

- admin: sees everything; changes everything (types, projects, tokens, any job).
- user: sees the jobs, data and logs of its projects; registers, changes, switches and runs their
  jobs, adds and cancels their tasks; requests exports of them.
- analyst: sees the jobs, data and logs of its projects; requests exports of them.
- exports, for a user or an analyst: those of its projects that it requested, or whose job it
  was granted (``token grant``); an admin sees all.

What belongs to a project the caller does not hold does not exist for it: naming it answers
404 with the same sentence as a name nobody uses, never 403. 403 is only for something the
caller sees but whose change its role does not allow. ``None`` as the token is the operator at
the master's command line, who holds everything.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.errors import Forbidden, NotFound
from common.store import jobs, projects
from common.store.control_models import ADMIN, ANALYST
from common.store.records import Job

if TYPE_CHECKING:
    from common.store.control import Token


def is_admin(token: Token | None) -> bool:
    return token is None or token.role == ADMIN


def held(token: Token | None) -> list[int] | None:
    """The project ids the caller holds; None: every project."""
    return None if is_admin(token) else list(token.projects)  # type: ignore[union-attr]


def project_of(job: Job) -> int:
    """A job's project (one stored before projects is in ``default``)."""
    return job.project if job.project is not None else projects.default_id()


def holds(token: Token | None, project_id: int | None) -> bool:
    ids = held(token)
    if ids is None:
        return True
    return (project_id if project_id is not None else projects.default_id()) in ids


def may_change(token: Token | None) -> bool:
    """Whether the caller's role may change the jobs of its projects (not an analyst's)."""
    return token is None or token.role != ANALYST


def job(name: Any, token: Token | None, change: bool = False) -> Job:
    """The job ``name`` if the caller holds its project (else NotFound, as for no such job); with
    ``change``, the caller's role must also be admin or user (else Forbidden)."""
    found = jobs.named(name)
    if not holds(token, found.project):
        raise NotFound(f"no job named {name!r}")  # word for word what no such job answers
    if change and token is not None and token.role == ANALYST:
        raise Forbidden("role analyst may not change a job: a user or admin token is needed")
    return found


def job_by_id(job_id: Any, token: Token | None, what: str) -> None:
    """NotFound (saying ``what``) unless the caller holds the project of job ``job_id``."""
    visible = visible_job_ids(token)
    if visible is not None and job_id not in visible:
        raise NotFound(what)


def visible_job_ids(token: Token | None) -> list | None:
    """The ids of the jobs the caller sees; None: every job."""
    ids = held(token)
    return None if ids is None else projects.job_ids(ids, projects.default_id())


def visible_job_names(token: Token | None) -> set[str] | None:
    ids = held(token)
    return None if ids is None else set(projects.job_names(ids, projects.default_id()))


def check_project(token: Token | None, project_id: int) -> None:
    """NotFound unless project ``project_id`` exists and the caller holds it."""
    if projects.by_id(project_id) is None or not holds(token, project_id):
        raise NotFound(f"no project {project_id}")


def project_for_new_job(token: Token | None, wanted: int | None) -> int:
    """The project a job registered by the caller goes to: ``wanted`` (which it must hold), or,
    when it names none, its only project (an admin's: ``default``)."""
    if wanted is not None:
        check_project(token, wanted)
    if token is not None and token.role == ANALYST:
        raise Forbidden("role analyst may not register a job: a user or admin token is needed")
    if wanted is not None:
        return wanted
    ids = held(token)
    if ids is None:
        return projects.default_id()
    if len(ids) != 1:
        raise NotFound("name the project of the job (project = ID): this token holds "
                       + (f"{len(ids)} projects" if ids else "no project"))
    return ids[0]
