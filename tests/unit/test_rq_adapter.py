"""The rq adapter is the only place that knows rq's insides: it is pinned to the rq it was
written for, and nothing outside it spells an rq key or touches a private rq attribute."""
from __future__ import annotations

import re
from pathlib import Path

import rq

from common.queue import rqbridge

ROOT = Path(__file__).resolve().parents[2]


def test_the_rq_version_is_the_one_the_adapter_matches():
    assert rq.__version__ == rqbridge.RQ_VERSION


RQ_KEY = re.compile(
    r"""["']rq:(job|queue|wip|worker|workers|queues|finished|failed|deferred|scheduled|pubsub|executions?|results?)\b"""
)
PRIVATE = re.compile(r"\b(job|queue|worker|registry|execution|rq_job)\._[a-z]\w*")


def test_nothing_outside_the_rq_adapter_spells_an_rq_key_or_a_private_attribute():
    offenders = []
    for path in sorted((ROOT / "common").rglob("*.py")) + sorted((ROOT / "master").rglob("*.py")) + \
            sorted((ROOT / "slave").rglob("*.py")) + sorted((ROOT / "scripts").rglob("*.py")):
        if path.name == "rqbridge.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if RQ_KEY.search(line) or PRIVATE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []
