"""Only ``common/store/`` touches MongoDB: every other product module (``master/``, ``slave/``,
``common/``) calls the store's named operations. Read from the source, no services needed.

A module outside the store may not
  * reach a collection or database: ``_get_collection``, ``get_collection``, ``get_database``;
  * query through mongoengine: ``.objects``;
  * change a document through mongoengine: ``.save()``, ``.modify()``, ``.delete()`` without
    arguments, ``.update()`` with mongoengine's operator keywords (``set__name=...``);
  * import a mongoengine Document class from ``common.store.models``, ``log_models``,
    ``control_models`` or ``schema`` (status constants and roles may be imported), or
    ``collection`` (a class's pymongo collection) from ``common.store.connection`` (its Redis
    clients may be imported, and the clock of ``common.store.clock``);
  * make a MongoDB client or a GridFS bucket (``MongoClient``, ``GridFS``, ``GridFSBucket``):
    the store's connection module holds the connections.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from common.store.schema import ALL_MODELS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("master", "slave", "common")
STORE = ROOT / "common" / "store"
RAW = {"_get_collection", "get_collection", "get_database"}
CLIENTS = {"MongoClient", "GridFS", "GridFSBucket"}
DOCUMENT_CLASSES = {m.__name__ for m in ALL_MODELS}
MODEL_MODULES = ("common.store.models", "common.store.log_models", "common.store.control_models",
                 "common.store.schema")
UPDATE_OPS = ("set__", "unset__", "inc__", "dec__", "push__", "pull__", "add_to_set__", "pop__", "max__",
              "min__")

def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if STORE not in p.parents)


def _changes_a_document(call: ast.Call) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if name in ("save", "modify"):
        return True
    if name == "delete":
        return not call.args and not call.keywords
    if name == "update":
        return bool(call.keywords) and all((k.arg or "").startswith(UPDATE_OPS) for k in call.keywords)
    return False


def breaches(source: str) -> list[str]:
    """What in ``source`` breaks the rule, one line each (line number and what)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RAW | {"objects"}:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and _changes_a_document(node):
            found.append(f"{node.lineno}: .{node.func.attr}() on a document")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("pymongo", "gridfs"):
            found += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name in CLIENTS]
        elif isinstance(node, ast.ImportFrom) and node.module in MODEL_MODULES:
            found += [f"{node.lineno}: imports {a.name}" for a in node.names
                      if a.name in DOCUMENT_CLASSES | {"collection", "ALL_MODELS"}]
        elif isinstance(node, ast.ImportFrom) and node.module == "common.store.connection":
            found += [f"{node.lineno}: imports collection" for a in node.names if a.name == "collection"]
        elif isinstance(node, ast.ImportFrom) and node.module == "common.store":
            found += [f"{node.lineno}: imports the models module" for a in node.names
                      if f"common.store.{a.name}" in MODEL_MODULES]
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: imports the models module" for a in node.names
                      if a.name in MODEL_MODULES]
    return found


def _all_breaches() -> dict[str, list[str]]:
    out = {}
    for path in _modules():
        got = breaches(path.read_text())
        if got:
            out[str(path.relative_to(ROOT))] = got
    return out


def test_only_the_store_touches_mongodb():
    found = _all_breaches()
    assert not found, "call a named operation of common/store/ instead:\n" + "\n".join(
        f"  {path}:{line}" for path, lines in sorted(found.items()) for line in lines)


@pytest.mark.parametrize("source", [
    "from common.store.models import CrawlerTask\n",
    "from common.store.models import collection\n",
    "from common.store.connection import collection\n",
    "from common.store import models\n",
    "from common.store.log_models import CrawlerDownloadLog\n",
    "from common.store.control_models import ApiToken\n",
    "from common.store.schema import ALL_MODELS\n",
    "from common.store import log_models\n",
    "x = Job.objects(name='a').first()\n",
    "coll = thing._get_collection()\n",
    "from pymongo import MongoClient\n",
    "from gridfs import GridFSBucket\n",
    "db = client.get_database('x')\n",
    "job.save()\n",
    "job.delete()\n",
    "job.update(set__status='OFF')\n",
    "job.modify(status='OFF')\n",
])
def test_the_rule_catches(source):
    assert breaches(source)


@pytest.mark.parametrize("source", [
    "from common.store.models import LIVE, TASK_STATUSES\n",
    "from common.store.clock import store_now, iso\n",
    "from common.store.connection import redis_conn\n",
    "from common.store.jobs import named\n",
    "from common.store.control_models import ADMIN, ROLES\n",
    "redis.delete(key)\n",
    "fs.delete(file_id)\n",
    "d.update(other)\n",
    "d.update(a=1)\n",
])
def test_the_rule_lets_pass(source):
    assert not breaches(source)
