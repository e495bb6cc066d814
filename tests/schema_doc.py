"""The schema tables of docs/schema.md ("Data for analysts") read back: {collection: {field, ...}} per
database, for tests that hold the docs to what the models declare and what a run stores."""
from __future__ import annotations

import re
from pathlib import Path

SCHEMA = Path(__file__).resolve().parent.parent / "docs" / "schema.md"
DATABASES = ("source", "log", "control")


def _fields(cell: str) -> set[str]:
    """Field names of a table cell: the first `name` of each comma-separated part (parentheses
    and what follows an em dash are comments)."""
    cell = cell.split(" — ")[0]
    parts, depth, cur = [], 0, ""
    for ch in cell:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = set()
    for part in parts:
        found = re.match(r"\s*`([A-Za-z_][A-Za-z0-9_]*)`", part)
        if found:
            out.add(found.group(1))
    return out


def documented() -> dict[str, dict[str, set[str]]]:
    section = SCHEMA.read_text(encoding="utf-8")
    out: dict[str, dict[str, set[str]]] = {db: {} for db in DATABASES}
    current = None
    for line in section.splitlines():
        head = re.match(r"^\*\*(source|log|control)\*\*", line)
        if head:
            current = head.group(1)
            continue
        row = re.match(r"^\| `([a-z_]+)` \| (.*?) \|", line)
        if row and current:
            out[current][row.group(1)] = _fields(row.group(2))
    return out
