"""The packages' import graph, read from the source: no two modules import each other, and the
master and the slave never import one another."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_modules_import_each_other():
    graph: dict[str, set[str]] = {}
    for pkg in ("common", "master", "slave"):
        for path in (ROOT / pkg).rglob("*.py"):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            deps = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    deps.add(node.module)
                    deps.update(f"{node.module}.{a.name}" for a in node.names)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names)
            graph[mod] = deps
    pairs = sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps
                    if b in graph and b != a and a in graph[b]})
    assert pairs == []
    crossing = sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        for b in deps
        if (a.startswith("master") and b.startswith("slave"))
        or (a.startswith("slave") and b.startswith("master"))
    )
    assert crossing == []


def test_the_download_package_never_imports_the_worker():
    """The worker makes its outcomes of what slave.download answers; the reverse would be a
    package cycle (slave.download -> slave.worker -> slave.download)."""
    found = sorted(
        f"{path.relative_to(ROOT)}: {node.module}"
        for path in (ROOT / "slave" / "download").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slave.worker")
    )
    assert found == []


def test_no_function_of_the_slave_is_over_50_lines():
    """The house rule, held for slave/ (the engines and the worker)."""
    long = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in (ROOT / "slave").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (node.end_lineno or 0) - node.lineno + 1 > 50
    )
    assert long == []
