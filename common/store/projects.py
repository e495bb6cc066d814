"""Projects (``project``, control database): ids assigned by the cluster, 1, 2, ..., and the
upgrade that puts jobs, exports and tokens stored before projects into the ``default`` project.

Invariant: a project's id never changes and is never given to another project (ids only grow:
the next is the highest so far plus one, taken with an insert that a unique ``_id`` makes
race-free).
"""
from __future__ import annotations

from typing import Any

from bson import ObjectId
from pymongo.errors import DuplicateKeyError

from common.store.clock import utcnow
from common.store.connection import collection
from common.store.control_models import ADMIN, DEFAULT_PROJECT, ApiToken, Project
from common.store.models import Export, Job
from common.store.records import Project as ProjectRecord
from common.store.records import Token


def add(name: str, allow_private: bool = False) -> ProjectRecord:
    """A new project ``name`` with the next id (DuplicateKeyError if the name exists)."""
    coll = collection(Project)
    while True:
        last = coll.find_one({}, {"_id": 1}, sort=[("_id", -1)])
        doc: dict[str, Any] = {"_id": (last["_id"] if last else 0) + 1, "name": name,
                               "add_datetime": utcnow()}
        if allow_private:
            doc["allow_private"] = True
        try:
            coll.insert_one(doc)
            return ProjectRecord.from_doc(doc)
        except DuplicateKeyError:
            if by_name(name) is not None:
                raise
            # another process took that id first: take the next one


def by_id(project_id: int) -> ProjectRecord | None:
    return ProjectRecord.maybe(collection(Project).find_one({"_id": project_id}))


def allows_private(project_id: int | None) -> bool:
    """Whether the download tasks of project ``project_id`` may pull from private addresses."""
    if project_id is None:
        return False
    found = collection(Project).find_one({"_id": project_id}, {"allow_private": 1})
    return bool(found and ProjectRecord.from_doc(found).allow_private)


def by_name(name: str) -> ProjectRecord | None:
    return ProjectRecord.maybe(collection(Project).find_one({"name": name}))


def listing(ids: list[int] | None = None) -> list[ProjectRecord]:
    """Every project (or those of ``ids``), by id."""
    query = {} if ids is None else {"_id": {"$in": list(ids)}}
    return [ProjectRecord.from_doc(d) for d in collection(Project).find(query).sort("_id", 1)]


def default_id() -> int:
    """The ``default`` project's id, made on first use (the project of jobs stored before projects)."""
    found = by_name(DEFAULT_PROJECT)
    if found is not None:
        return found.id
    try:
        return add(DEFAULT_PROJECT).id
    except DuplicateKeyError:  # made meanwhile by another process
        made = by_name(DEFAULT_PROJECT)
        assert made is not None
        return made.id


def grant(token_id: ObjectId, project_ids: list[int], remove: bool = False) -> list[int]:
    """Add the projects to (or pull them from) a token; its projects after, sorted."""
    if remove:
        ApiToken.objects(id=token_id).update_one(pull_all__projects=project_ids)
    else:
        ApiToken.objects(id=token_id).update_one(add_to_set__projects=project_ids)
    return sorted(Token.from_doc(collection(ApiToken).find_one({"_id": token_id}, {"projects": 1})
                                 or {"_id": token_id}).projects)


def job_ids(project_ids: list[int], default: int) -> list[ObjectId]:
    """The ids of the jobs of these projects (a job without a project is in ``default``'s)."""
    query: dict[str, Any] = {"project": {"$in": list(project_ids)}}
    if default in project_ids:
        query = {"$or": [query, {"project": None}]}
    return [doc["_id"] for doc in collection(Job).find(query, {"_id": 1})]


def job_names(project_ids: list[int], default: int) -> list[str]:
    query: dict[str, Any] = {"project": {"$in": list(project_ids)}}
    if default in project_ids:
        query = {"$or": [query, {"project": None}]}
    return [str(doc["name"]) for doc in collection(Job).find(query, {"name": 1})]


def upgrade() -> tuple[int, int, int]:
    """Put what was stored before projects into ``default``: jobs and exports without a project,
    and every non-admin token that holds no project (an analyst read every job before: it keeps
    reading what ``default`` holds). How many (jobs, exports, tokens) changed. Safe to repeat."""
    default = default_id()
    jobs = collection(Job).update_many({"project": None}, {"$set": {"project": default}}).modified_count
    by_job = {doc["_id"]: doc.get("project") for doc in collection(Job).find({}, {"project": 1})}
    exports = 0
    for doc in collection(Export).find({"project": None}, {"job": 1}):
        exports += collection(Export).update_one(
            {"_id": doc["_id"], "project": None},
            {"$set": {"project": by_job.get(doc.get("job"), default)}}).modified_count
    # a token stored before projects has no ``projects`` field at all (a newer one holds a list,
    # perhaps empty): only those are given ``default``, so a second run changes nothing
    tokens = collection(ApiToken).update_many(
        {"role": {"$ne": ADMIN}, "projects": {"$exists": False}},
        {"$set": {"projects": [default]}}).modified_count
    return jobs, exports, tokens
