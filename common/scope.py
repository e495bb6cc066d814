"""Scope: whether a job follows a URL found on one of its pages, and why not.

One pure function, ``refusal``, used wherever a found URL is judged (the worker before it hands
links on, intake before it adds them). Scope is judged against the page's own task URL, never
where it redirected to: a seed's descendants then stay in scope by induction, and a redirect out
of scope cannot widen it. The URL is expected canonical (``common.urls.canonical``).
"""
from __future__ import annotations

import ipaddress
from functools import lru_cache
from urllib.parse import urlsplit

from common.errors import ValidationError
from common.jobsettings import MAX_URL_LENGTH, Follow
from common.urls import canonical, url_pattern


def refusal(follow: Follow, page_url: str, url: str, depth: int, pages: int = 0) -> str | None:
    """None if ``url``, found on the page of task URL ``page_url``, is followed at ``depth`` (the
    page's depth + 1) when the job already has ``pages`` pages; else the reason it is not."""
    if depth > follow.max_depth:
        return f"deeper than max_depth {follow.max_depth}"
    if pages >= follow.max_pages:
        return f"the job has max_pages {follow.max_pages}"
    if len(url) > MAX_URL_LENGTH:
        return f"longer than {MAX_URL_LENGTH} characters"
    try:
        parts, page = urlsplit(url), urlsplit(page_url)
    except ValueError:
        return "malformed URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL"
    return _outside(follow, parts.hostname, page.hostname or "") or _unmatched(follow, url)


def redirect_refusal(follow: Follow, page_url: str, target: str) -> str | None:
    """Why a redirect of the page of task URL ``page_url`` to ``target`` leaves the job's scope,
    or None: judged as a link found on that page would be (hosts, patterns, length), the depth
    and pages caps aside (the redirect is that page's own fetch, not a new page)."""
    try:
        url = canonical(target, MAX_URL_LENGTH)
    except ValidationError as exc:
        return str(exc)
    return refusal(follow, page_url, url, 0)


def _outside(follow: Follow, host: str, page_host: str) -> str | None:
    """Why ``host`` is outside the job's scope as seen from a page on ``page_host``, or None."""
    if follow.scope == "site" and host != page_host:
        return f"another site than {page_host}"
    if follow.scope == "domain" and registrable_domain(host) != registrable_domain(page_host):
        return f"outside the domain {registrable_domain(page_host)}"
    if follow.scope == "sites" and not any(host == s or host.endswith("." + s) for s in follow.sites):
        return "not one of the job's sites"
    return None


def _unmatched(follow: Follow, url: str) -> str | None:
    """Why ``url`` fails the job's allow and deny patterns, or None."""
    if follow.allow and not any(_compiled(p).search(url) for p in follow.allow):
        return "matches no allow pattern"
    for pattern in follow.deny:
        if _compiled(pattern).search(url):
            return f"matches deny pattern {pattern[:80]!r}"
    return None


def registrable_domain(host: str) -> str:
    """The domain a registrant holds (``example.co.uk`` for ``a.b.example.co.uk``), from the
    Public Suffix List bundled with ``publicsuffixlist`` (no network); an IP address, a public
    suffix or a single-label host is its own."""
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return _suffixes().privatesuffix(host) or host


@lru_cache(maxsize=1)
def _suffixes():
    from publicsuffixlist import PublicSuffixList  # the list is parsed once, when first needed

    return PublicSuffixList()


@lru_cache(maxsize=1024)
def _compiled(pattern: str):
    return url_pattern(pattern)  # checked at registration
