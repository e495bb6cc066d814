"""Only ``common/store/`` names the fields of a stored document: the store hands out typed records
(``common/store/records.py``), so every other product module reads attributes that mypy checks,
never a document's keys. Read from the source, no services needed.

Two rules:
  * no store function returns a document: a public function of ``common/store/`` is annotated,
    and its result is neither a ``dict`` keyed by text nor a mongoengine Document (nor holds one);
  * outside the store, no value that came from the store is read by a stored field's name: a
    subscript ``v["status"]``, ``v.get("status")`` or ``getattr(v, "status")`` where ``v`` is the
    result of a call into ``common.store`` (or a name bound from one: assigned, unpacked, looped
    over or taken out of one, or a parameter of a function of the same module that is passed
    one), and the key is a field of a document of ``common.store.schema.ALL_MODELS``.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

import pytest

from common.store.schema import ALL_MODELS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("master", "slave", "common")
STORE = ROOT / "common" / "store"
MODELS = {m.__name__: m for m in ALL_MODELS}  # every document class, of the three databases
FIELDS = {f.db_field or name for cls in MODELS.values() for name, f in cls._fields.items()}
FIELDS.add("_id")
READS = ("get", "pop", "setdefault")
DRIVER = ("Collection", "MongoClient")

# The store's plumbing: raw documents for the other store modules to make records of (a test below
# keeps its document-returning functions inside the store).
PLUMBING = {"paging.py", "claims.py", "fence.py"}
RECORD_MODULES = ("common.store.records", "common.store.logrecords")  # where records are defined


# --- the store's results ----------------------------------------------------------------------

def _document_like(annotation: ast.expr, records: set[str], aliases: frozenset[str] = frozenset()) -> bool:
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in DRIVER:
        return False  # a driver's object, parameterised by its documents' type (test_store_only keeps it in)
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id in aliases:
            return True
        if isinstance(node, ast.Name) and node.id in (set(MODELS) - records) | {"dict"}:
            if node.id != "dict":
                return True
            parent = next((p for p in ast.walk(annotation)
                           if isinstance(p, ast.Subscript) and p.value is node), None)
            if parent is None:
                return True  # a bare dict
            key, value = parent.slice.elts if isinstance(parent.slice, ast.Tuple) else (None, None)
            if ast.unparse(key) == "str" and ast.unparse(value) in ("Any", "object"):
                return True  # fields by name (dict[str, int]: counts by name, not a document)
    return False


def _aliases(tree: ast.Module, records: set[str] = frozenset()) -> frozenset[str]:
    """Names a module gives a document type (``Doc = dict[str, Any]``)."""
    return frozenset(node.targets[0].id for node in tree.body
                     if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                     and isinstance(node.value, (ast.Subscript, ast.Name))
                     and _document_like(node.value, set(records)))


STORE_ALIASES = frozenset().union(*(_aliases(ast.parse(p.read_text())) for p in STORE.glob("*.py")))


def document_results(source: str) -> list[str]:
    """The public functions of a store module that return documents, or say nothing of it."""
    found, tree = [], ast.parse(source)
    # a name imported from the records is the record (Job), not the model of that name
    records = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module in RECORD_MODULES for a in node.names}
    aliases = _aliases(tree, records) | STORE_ALIASES
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if node.returns is None:
                found.append(f"{node.lineno}: {node.name} (no return annotation)")
            elif _document_like(node.returns, records, aliases):
                found.append(f"{node.lineno}: {node.name} -> {ast.unparse(node.returns)}")
    return found


def test_store_functions_return_records():
    found = {p.name: document_results(p.read_text()) for p in sorted(STORE.glob("*.py"))}
    wrong = {name: got for name, got in found.items() if got and name not in PLUMBING}
    assert not wrong, "return a record of common/store/records.py:\n" + "\n".join(
        f"  common/store/{name}:{line}" for name, lines in sorted(wrong.items()) for line in lines)


def _raw_uses(tree: ast.Module, raw: dict[str, set[str]]) -> Iterator[str]:
    """Where ``tree`` reaches a function of ``raw`` ({plumbing module: its document-returning
    functions}): imported by name, or called through the imported module."""
    bound: dict[str, str] = {}  # local name -> plumbing module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in raw:
            yield from (f"{node.lineno}: imports {a.name}" for a in node.names if a.name in raw[node.module])
        elif isinstance(node, ast.ImportFrom) and node.module:
            bound |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                      if f"{node.module}.{a.name}" in raw}
        elif isinstance(node, ast.Import):
            bound |= {a.asname or a.name: a.name for a in node.names if a.name in raw}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and node.attr in raw[bound[node.value.id]]):
            yield f"{node.lineno}: {node.value.id}.{node.attr}"


def test_the_plumbing_stays_in_the_store():
    raw = {f"common.store.{name.removesuffix('.py')}":
           {line.split(": ")[1].split(" ")[0] for line in document_results((STORE / name).read_text())}
           for name in PLUMBING}
    found = [f"{p.relative_to(ROOT)}:{use}" for p in _modules()
             for use in _raw_uses(ast.parse(p.read_text()), raw)]
    assert not found, f"only common/store/ reads raw documents (of {', '.join(sorted(PLUMBING))}): {found}"


# --- reads outside the store ------------------------------------------------------------------

def _store_names(tree: ast.Module) -> set[str]:
    """Names bound by importing from ``common.store`` (modules and functions alike)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common.store"):
            names |= {a.asname or a.name for a in node.names if not a.name.isupper()}
        elif isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.startswith("common.store")}
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _targets(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _targets(elt)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return []


class _Reads(ast.NodeVisitor):
    """Per function (and the module body): names holding the store's results, and reads of them.
    ``params``: the parameters, per function of the module, that are passed such a result
    somewhere in it (grown by repeated visits until nothing changes)."""

    def __init__(self, store_names: set[str], functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef],
                 params: dict[str, set[str]]) -> None:
        self.store_names, self.functions, self.params = store_names, functions, params
        self.found: list[str] = []
        self.held: set[str] = set()

    def from_store(self, node: ast.expr | None) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.Call):
            return _root(node.func) in self.store_names
        if isinstance(node, ast.Name):
            return node.id in self.held
        if isinstance(node, ast.Subscript):  # taken out of a result: taken["generator"], rows[0]
            return self.from_store(node.value)
        if isinstance(node, ast.BoolOp):
            return any(self.from_store(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.from_store(node.body) or self.from_store(node.orelse)
        if isinstance(node, ast.Await):
            return self.from_store(node.value)
        return False

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.held = self.held, set(self.params.get(node.name, ()))
        self.generic_visit(node)
        self.held = outer

    def _passes(self, node: ast.Call) -> None:
        """A call of a function of this module with a store result: that parameter holds one."""
        target = self.functions.get(node.func.id) if isinstance(node.func, ast.Name) else None
        if target is None:
            return
        names = [a.arg for a in target.args.posonlyargs + target.args.args]
        given = [(names[i], a) for i, a in enumerate(node.args) if i < len(names)]
        given += [(k.arg, k.value) for k in node.keywords if k.arg in names]
        held = {name for name, value in given if self.from_store(value)}
        if not held <= self.params.setdefault(target.name, set()):
            self.params[target.name] |= held

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        if self.from_store(node.value):
            self.held |= {n for t in node.targets for n in _targets(t)}
        for t in node.targets:
            self.visit(t)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            if self.from_store(node.value):
                self.held |= set(_targets(node.target))

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        if self.from_store(node.value):
            self.held |= set(_targets(node.target))

    def _loop(self, target: ast.expr, iterable: ast.expr) -> None:
        if self.from_store(iterable) or (isinstance(iterable, ast.Call) and any(
                self.from_store(a) for a in iterable.args)):  # enumerate(...), zip(...), sorted(...)
            self.held |= set(_targets(target))

    def visit_For(self, node: ast.For) -> None:
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._loop(node.target, node.iter)
        self.generic_visit(node)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        for gen in node.generators:  # the loops bind first, then the element reads them
            self.visit(gen)
        for child in (getattr(node, "elt", None), getattr(node, "key", None), getattr(node, "value", None)):
            if child is not None:
                self.visit(child)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def _read(self, node: ast.AST, value: ast.expr, key: ast.expr) -> None:
        if isinstance(key, ast.Constant) and key.value in FIELDS and self.from_store(value):
            self.found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node, node.value, node.slice)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._passes(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in READS and node.args:
            self._read(node, func.value, node.args[0])
        elif isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
            self._read(node, node.args[0], node.args[1])
        self.generic_visit(node)


def field_reads(source: str) -> list[str]:
    """The reads in ``source`` of a stored field by its name, from what the store returned."""
    tree = ast.parse(source)
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    params: dict[str, set[str]] = {}
    while True:
        before = {name: set(held) for name, held in params.items()}
        reads = _Reads(_store_names(tree), functions, params)
        reads.visit(tree)
        if params == before:
            return reads.found


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if STORE not in p.parents)


def test_no_module_outside_the_store_names_a_stored_field():
    found = {str(p.relative_to(ROOT)): field_reads(p.read_text()) for p in _modules()}
    wrong = {path: got for path, got in found.items() if got}
    assert not wrong, "read the record's attribute (common/store/records.py) instead:\n" + "\n".join(
        f"  {path}:{line}" for path, lines in sorted(wrong.items()) for line in lines)


@pytest.mark.parametrize("source", [
    "from common.store import jobs\ndef f():\n    return jobs.find('a')['status']\n",
    "from common.store import jobs\ndef f():\n    job = jobs.find('a')\n    return job.get('seq_sent')\n",
    "from common.store import generators\ndef f(now):\n    for gen in generators.due(now):\n"
    "        print(gen['next_at'])\n",
    "from common.store import generators\ndef f():\n    taken = generators.start_run('r')\n"
    "    gen = taken['generator']\n    return gen['job']\n",
    "from common.store.tasks import lease_tasks\ndef f():\n    return [t['uri'] for t in lease_tasks('x')]\n",
    "from common.store import logs\ndef f():\n    for n, d in enumerate(logs.of_task(1)):\n"
    "        getattr(d, 'status')\n",
    "from common.store import jobs\ndef g(job):\n    return job['name']\n"
    "def f():\n    return g(jobs.find('a'))\n",
])
def test_the_read_rule_catches(source):
    assert field_reads(source)


@pytest.mark.parametrize("source", [
    "from common.store import jobs\ndef f():\n    return jobs.find('a').status\n",
    "from common.store import jobs\ndef f(body):\n    jobs.find('a')\n    return body['status']\n",
    "from common.store import jobs\ndef f():\n    names = jobs.names()\n    return names.get('x')\n",
    "def f(msg):\n    return msg['type'], msg.get('status')\n",
])
def test_the_read_rule_lets_pass(source):
    assert not field_reads(source)


@pytest.mark.parametrize("source, caught", [
    ("def f() -> dict:\n    return {}\n", True),
    ("def f() -> list[dict[str, Any]]:\n    return []\n", True),
    ("def f() -> Export | None:\n    return None\n", True),
    ("def f():\n    return 1\n", True),
    ("def f() -> dict[ObjectId, str]:\n    return {}\n", False),
    ("Doc = dict[str, Any]\ndef f() -> list[Doc]:\n    return []\n", True),
    ("from common.store.records import Job\ndef f() -> list[Job]:\n    return []\n", False),
    ("def f() -> list[Job]:\n    return []\n", True),  # the model Job
    ("def _f() -> dict:\n    return {}\n", False),
])
def test_the_result_rule(source, caught):
    assert bool(document_results(source)) is caught


RECORD_OF = {"Job": "Job", "CrawlerDownloadSetting": "JobSettings", "CrawlerTask": "Task",
             "CrawlerLease": "Lease", "CrawlerDownloadData": "DataDoc", "CrawlerDownloadLog": "DownloadLog",
             "Export": "ExportRecord",
             "CrawlerGenerator": "Generator", "CrawlerGeneratorLog": "GeneratorRun",
             "Notification": "NotificationRecord", "ApiToken": "Token", "Project": "Project",
             "AuditEntry": "AuditEntry", "CrawlerDownloadType": "DownloadType",
             "CrawlerDispatchLog": "DispatchLog", "WebSession": "Session",
             "CrawlerDispatchAlertLog": "AlertLog", "CrawlerRegistrationErrorLog": "RegistrationError"}


@pytest.mark.parametrize("model, record", sorted(RECORD_OF.items()))
def test_a_record_holds_its_documents_fields(model, record):
    from dataclasses import fields
    from importlib import import_module

    found = [vars(import_module(m))[record] for m in RECORD_MODULES if record in vars(import_module(m))]
    assert len(found) == 1 and {f.name for f in fields(found[0])} == set(MODELS[model]._fields)


def test_a_record_goes_to_its_document_and_back():
    from datetime import datetime

    from bson import ObjectId

    from common.store.records import Lease, Task

    task = Task(id=ObjectId(), job=ObjectId(), uri="http://a.test/", status="SUCCESS", history=["l1"],
                add_datetime=datetime(2026, 1, 1))
    doc = task.to_doc()
    assert doc["_id"] == task.id and "retry_at" not in doc  # None: absent
    assert Task.from_doc(doc) == task
    assert Lease.from_doc({"_id": "x"}).state == "QUEUED"  # a field the read left out: the model's default
    assert Lease.from_doc({"_id": "x", "ids": None}).ids == ()  # a stored null: the same
