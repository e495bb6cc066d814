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


PRODUCT = ("master", "slave", "common")  # and settings.py


def _product_sources() -> list[Path]:
    return sorted([p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")] + [ROOT / "settings.py"])


def over_50_lines(source: str) -> list[str]:
    """The functions (methods, nested and async ones too) of ``source`` longer than 50 lines,
    decorators not counted, docstrings counted: ``name:line (n lines)``."""
    return [f"{node.name}:{node.lineno} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (node.end_lineno or 0) - node.lineno + 1 > 50]


def test_no_function_of_the_product_is_over_50_lines():
    """The house rule, held for the product: master/, slave/, common/ and settings.py."""
    long = [f"{path.relative_to(ROOT)} {found}" for path in _product_sources()
            for found in over_50_lines(path.read_text())]
    assert long == []


def test_the_length_rule_counts_lines():
    def body(indent: str, lines: int) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(lines))

    assert over_50_lines("def f():\n" + body("    ", 49)) == []  # 50 lines
    assert over_50_lines("def f():\n" + body("    ", 50)) == ["f:1 (51 lines)"]
    assert over_50_lines("class C:\n    async def g(self):\n" + body("        ", 50)) == ["g:2 (51 lines)"]
