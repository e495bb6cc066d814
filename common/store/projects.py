"""Projects (``project``, control database): ids assigned by the cluster, 1, 2, ..., and the
upgrade that puts jobs, exports and tokens stored before projects into the ``default`` project.

Invariant: a project's id never changes and is never given to another project (ids only grow:
the next is the highest so far plus one, taken with an insert that a unique ``_id`` makes
race-free).
"""
from __future__ import annotations

from pymongo.errors import DuplicateKeyError

from common.store.models import ADMIN, DEFAULT_PROJECT, ApiToken, Export, Job, Project, utcnow


def add(name: str, allow_private: bool = False) -> Project:
    """A new project ``name`` with the next id (DuplicateKeyError if the name exists)."""
    coll = Project._get_collection()
    while True:
        last = coll.find_one({}, {"_id": 1}, sort=[("_id", -1)])
        doc = {"_id": (last["_id"] if last else 0) + 1, "name": name, "add_datetime": utcnow()}
        if allow_private:
            doc["allow_private"] = True
        try:
            coll.insert_one(doc)
            return Project._from_son(doc)
        except DuplicateKeyError:
            if by_name(name) is not None:
                raise
            # another process took that id first: take the next one


def by_id(project_id: int) -> Project | None:
    return Project.objects(id=project_id).first()


def allows_private(project_id: int | None) -> bool:
    """Whether the download tasks of project ``project_id`` may pull from private addresses."""
    found = Project.objects(id=project_id).only("allow_private").first() if project_id is not None else None
    return bool(found and found.allow_private)


def by_name(name: str) -> Project | None:
    return Project.objects(name=name).first()


def listing(ids: list[int] | None = None) -> list[Project]:
    """Every project (or those of ``ids``), by id."""
    query = Project.objects if ids is None else Project.objects(id__in=list(ids))
    return list(query.order_by("id"))


def default_id() -> int:
    """The ``default`` project's id, made on first use (the project of jobs stored before projects)."""
    found = by_name(DEFAULT_PROJECT)
    if found is not None:
        return found.id
    try:
        return add(DEFAULT_PROJECT).id
    except DuplicateKeyError:  # made meanwhile by another process
        return Project.objects.get(name=DEFAULT_PROJECT).id


def grant(token_id, project_ids: list[int], remove: bool = False) -> list[int]:
    """Add the projects to (or pull them from) a token; its projects after, sorted."""
    if remove:
        ApiToken.objects(id=token_id).update_one(pull_all__projects=project_ids)
    else:
        ApiToken.objects(id=token_id).update_one(add_to_set__projects=project_ids)
    return sorted(ApiToken.objects.get(id=token_id).projects)


def job_ids(project_ids: list[int], default: int) -> list:
    """The ids of the jobs of these projects (a job without a project is in ``default``'s)."""
    query: dict = {"project": {"$in": list(project_ids)}}
    if default in project_ids:
        query = {"$or": [query, {"project": None}]}
    return [doc["_id"] for doc in Job._get_collection().find(query, {"_id": 1})]


def job_names(project_ids: list[int], default: int) -> list[str]:
    query: dict = {"project": {"$in": list(project_ids)}}
    if default in project_ids:
        query = {"$or": [query, {"project": None}]}
    return [doc["name"] for doc in Job._get_collection().find(query, {"name": 1})]


def upgrade() -> tuple[int, int, int]:
    """Put what was stored before projects into ``default``: jobs and exports without a project,
    and every non-admin token that holds no project (an analyst read every job before: it keeps
    reading what ``default`` holds). How many (jobs, exports, tokens) changed. Safe to repeat."""
    default = default_id()
    jobs = Job._get_collection().update_many({"project": None}, {"$set": {"project": default}}).modified_count
    by_job = {doc["_id"]: doc.get("project") for doc in Job._get_collection().find({}, {"project": 1})}
    exports = 0
    for doc in Export._get_collection().find({"project": None}, {"job": 1}):
        exports += Export._get_collection().update_one(
            {"_id": doc["_id"], "project": None},
            {"$set": {"project": by_job.get(doc.get("job"), default)}}).modified_count
    # a token stored before projects has no ``projects`` field at all (a newer one holds a list,
    # perhaps empty): only those are given ``default``, so a second run changes nothing
    tokens = ApiToken._get_collection().update_many(
        {"role": {"$ne": ADMIN}, "projects": {"$exists": False}},
        {"$set": {"projects": [default]}}).modified_count
    return jobs, exports, tokens
