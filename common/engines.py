"""Which engine downloads a job's pages, and what each engine is: the one table both the master
(registration) and the slave (the worker's pipeline) read.

A job names its engine in two fields: its downloader ``type`` (``none`` for the cluster's built-in
engines, ``python`` or ``shell`` for a downloader of its own, run in the sandbox) and, for type
``none``, the setting ``download_engine`` (aiohttp, requests or browser). ``engine_key`` folds
the two into one key; ``TRAITS`` says, for each key, what the rest of the cluster may assume:

- ``builtin``: the cluster's own code fetches (the job gives no code);
- ``sandboxed``: the downloader runs in a process of its own, stopped only by its time limit
  (its site slot is leased for that whole limit);
- ``coalesces``: identical requests of the engine may share one download (the same request
  gives the same answer: no script, no page JavaScript);
- ``obeys_robots``: robots.txt is read before a page is fetched (unless the job turns it off);
- ``gives_links``: a following job may read links from its pages (a shell downloader's body
  comes with no content type);
- ``needs_browser``: it renders in Chromium (``download_js`` is for it alone).

Adding an engine is one row here and one class in ``slave/download/engines/registry.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.jobsettings import ENGINES

DOWNLOADER_TYPES = ("python", "shell", "none")  # a job's ``type``; ``none``: a built-in engine
BUILTIN = "none"


@dataclass(frozen=True)
class Traits:
    builtin: bool = False
    sandboxed: bool = False
    coalesces: bool = False
    obeys_robots: bool = False
    gives_links: bool = True
    needs_browser: bool = False


TRAITS: dict[str, Traits] = {
    "aiohttp": Traits(builtin=True, coalesces=True, obeys_robots=True),
    "requests": Traits(builtin=True, coalesces=True, obeys_robots=True),
    "browser": Traits(builtin=True, obeys_robots=True, needs_browser=True),
    "python": Traits(sandboxed=True),
    "shell": Traits(sandboxed=True, gives_links=False),
}


def engine_key(language: str, engine: str = "") -> str:
    """The engine of a job of downloader type ``language`` and setting ``download_engine``
    ``engine`` (empty or unknown: the default engine): a key of ``TRAITS`` for every type
    registration accepts."""
    if language != BUILTIN:
        return language
    return engine if engine in ENGINES else ENGINES[0]


def traits(language: str, engine: str = "") -> Traits:
    """The traits of a job's engine (a type registration refuses has none)."""
    return TRAITS.get(engine_key(language, engine), Traits())
