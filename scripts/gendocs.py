"""Write the two reference documents generated from the code: docs/configuration.md from
settings.py (each name, its default and its docstring) and docs/api-reference.md from the
OpenAPI description the server publishes. ``--check`` exits 1 when either is out of date
(a unit test runs it), so the documents cannot drift from what they describe.

    python scripts/gendocs.py [--check]
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG_DOC, API_DOC = ROOT / "docs" / "configuration.md", ROOT / "docs" / "api-reference.md"

CONFIG_HEAD = """\
# Configuration

Generated from `settings.py` by `scripts/gendocs.py`; edit the docstrings there, not this file.

Every name below can be set, lowest to highest precedence, in `settings.py`, in a local file
named by `DOWNCLUSTER_SETTINGS` (`NAME = value` lines), as the environment variable
`DOWNCLUSTER_<NAME>` (e.g. `DOWNCLUSTER_Q_DOWN_LOW_LEN=50`), or by a command-line flag where one
exists. A process reads them once when it starts. Secrets (proxy credentials, cookies,
authorization headers, DSNs, passwords in URLs) are masked in logs, failure reasons and Sentry
events.
"""


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_rows(source: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """[(section, [(name, default as written, docstring)])] in the order of settings.py; a
    section is a ``# --- name ---`` comment line."""
    tree, lines = ast.parse(source), source.splitlines()
    sections: list[tuple[str, list[tuple[str, str, str]]]] = [("general", [])]
    heads = {i + 1: line.strip("# -") for i, line in enumerate(lines) if line.startswith("# ---")}
    body, last_line = tree.body, 0
    for node, after in zip(body, body[1:] + [None]):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper()):
            continue
        for number in sorted(n for n in heads if last_line < n < node.lineno):
            sections.append((heads[number], []))
        last_line = node.end_lineno or node.lineno
        doc = ""
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            doc = after.value.value
        default = ast.get_source_segment(source, node.value) or ""
        sections[-1][1].append((node.targets[0].id, default, doc))
    return [(name, rows) for name, rows in sections if rows]


def configuration_md() -> str:
    out = [CONFIG_HEAD]
    for section, rows in settings_rows((ROOT / "settings.py").read_text()):
        out += [f"\n## {section[0].upper()}{section[1:]}\n", "| name | default | meaning |", "|---|---|---|"]
        out += [f"| `{name}` | `{_one_line(default)}` | {_one_line(doc)} |" for name, default, doc in rows]
    return "\n".join(out) + "\n"


def openapi() -> dict:
    """The description the server publishes (building the app needs no service: MongoDB is
    connected lazily)."""
    from master.web.app import create_app

    return create_app().openapi()


def api_reference_md() -> str:
    spec = openapi()
    out = ["# HTTP API reference", "",
           "Generated from the OpenAPI description (`/api/v1/openapi.json`) by `scripts/gendocs.py`;",
           "the prose (roles, errors, the console, the reverse proxy) is in [api.md](api.md).", ""]
    tags: dict[str, list[str]] = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            statuses = ", ".join(sorted(op.get("responses", {})))
            params = ", ".join(f"`{p['name']}`" for p in op.get("parameters", []) if p.get("in") == "query")
            summary = _one_line((op.get("description") or op.get("summary") or "").split("\n\n")[0])
            row = f"| `{method.upper()} {path}` | `{op.get('operationId', '')}` | {params} | " \
                  f"{statuses} | {summary} |"
            tags.setdefault((op.get("tags") or ["other"])[0], []).append(row)
    for tag, rows in tags.items():
        out += [f"## {tag}", "", "| route | operation | query | statuses | what it does |",
                "|---|---|---|---|---|", *rows, ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    stale = []
    for path, text in ((CONFIG_DOC, configuration_md()), (API_DOC, api_reference_md())):
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run: python scripts/gendocs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
