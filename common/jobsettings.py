"""The job settings (a manifest's ``[settings]``, stored as ``crawler_download_setting``): one
typed declaration that registration validates against, the worker reads, and the model mirrors
(a test holds ``CrawlerDownloadSetting`` to it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from common.errors import ValidationError
from common.urls import check_url, site_name, url_pattern

ENGINES = ("aiohttp", "requests", "browser")  # built-in engines; the first is the default
# ``prior``, a job's queueing class (not its ``priority``, the queue level): entries of an urgent
# job go to the front of their queue, a foreign job's to the foreign queues
PRIOR_NORMAL, PRIOR_URGENCY, PRIOR_FOREIGN = 0, 1, 2


@dataclass(frozen=True)
class Setting:
    name: str
    value_type: type           # int, float, bool, str or dict
    default: Any               # a value, or the name of the cluster setting that gives it
    low: float | None = None   # numbers: inclusive bounds
    high: float | None = None
    max_len: int = 4096        # strings: at most this many characters
    lines: bool = False        # strings: may hold several lines
    doc: str = ""


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "dispatch_num", int, "DEFAULT_DISPATCH_NUM", 1, 100_000, doc="tasks of the job per dispatcher run"
    ),
    Setting("max_retry_times", int, "DEFAULT_MAX_RETRY_TIMES", 0, 100, doc="attempts before a FAIL is final"),
    Setting("proxy", str, "", doc="http://, https:// or socks5:// proxy URL (a secret: never logged)"),
    Setting("cookie", str, "", doc="Cookie header sent with every request (a secret: never logged)"),
    Setting("headers", dict, None, doc="extra request headers, a table of one-line strings"),
    Setting("download_engine", str, ENGINES[0], max_len=16, doc="built-in engine: " + ", ".join(ENGINES)),
    Setting(
        "download_js",
        str,
        "",
        max_len=100_000,
        lines=True,
        doc="browser engine: a function body run in the page",
    ),
    Setting(
        "prior",
        int,
        PRIOR_NORMAL,
        PRIOR_NORMAL,
        PRIOR_FOREIGN,
        doc="0 normal, 1 urgency (front of the queue), 2 foreign (foreign queues)",
    ),
    Setting(
        "report_mails", str, "", max_len=256, doc="comma-separated addresses for drain reports and alerts"
    ),
    Setting(
        "host_concurrency",
        int,
        0,
        0,
        10_000,
        doc="downloads in flight per site (0: the cluster's HOST_CONCURRENCY)",
    ),
    Setting(
        "host_delay",
        float,
        0.0,
        0,
        3600,
        doc="seconds between requests to one site (the stricter of this and HOST_DELAY)",
    ),
    Setting("obey_robots", bool, None, doc="built-in engine: obey robots.txt (unset: true)"),
    Setting(
        "allow_private",
        bool,
        False,
        doc="downloads (every engine and downloader) may reach loopback, private "
        "and link-local addresses (intranet crawls); the cluster's own services never",
    ),
    Setting(
        "revisit",
        float,
        0.0,
        0,
        366 * 86400,
        doc="seconds after a success its page is visited again (0: never); with revisit_max, the "
        "shortest interval of an adaptive revisit",
    ),
    Setting(
        "revisit_max",
        float,
        0.0,
        0,
        366 * 86400,
        doc="adaptive revisits: the longest interval (0: revisit is fixed); the interval halves "
        "when a page changed and doubles when it did not, between revisit and this",
    ),
    Setting(
        "data_retention_days",
        int,
        None,
        0,
        36_500,
        doc="days this job's data and final tasks are kept "
        "(0: for ever; unset: the cluster's DATA_RETENTION_DAYS)",
    ),
    Setting(
        "log_retention_days",
        int,
        None,
        0,
        36_500,
        doc="days this job's download logs are kept (0: for ever; unset: the cluster's LOG_RETENTION_DAYS)",
    ),
)
BY_NAME = {s.name: s for s in SETTINGS}
SETTING_NAMES = tuple(BY_NAME)


def defaults(cluster) -> dict[str, Any]:
    """Every setting at its default (``cluster``: the settings object giving cluster defaults)."""
    out = {}
    for s in SETTINGS:
        value = s.default
        if isinstance(value, str) and value.isupper():
            value = getattr(cluster, value)
        out[s.name] = {} if s.value_type is dict and value is None else value
    return out


def resolved(stored: dict[str, Any], cluster) -> dict[str, Any]:
    """A job's settings as stored (or given), each one missing or unset (an older document, an
    empty ``download_engine``) at its default; keys that are no setting are left out."""
    given = {k: v for k, v in stored.items() if k in BY_NAME and v is not None and v != ""}
    return {**defaults(cluster), **given}


def field_args(name: str) -> dict[str, Any]:
    """The model field's arguments for setting ``name``, from its declaration: bounds, length and
    default (a cluster setting's default is read when a document is made)."""
    s = BY_NAME[name]
    args: dict[str, Any] = {}
    if s.value_type in (int, float):
        args.update(min_value=s.low, max_value=s.high)
    elif s.value_type is str:
        args["max_length"] = s.max_len
    if isinstance(s.default, str) and s.default.isupper():
        args["default"] = lambda: getattr(_cluster(), s.default)
    elif s.default is not None and s.value_type is not dict:
        args["default"] = s.default
    return args


def _cluster():
    from common.config import settings  # imported when first needed: the model imports this module

    return settings


def check(raw: Any) -> dict[str, Any]:
    """Each given setting's type and bounds (one-line ValidationError); the given ones, as given."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValidationError("[settings] must be a table")
    unknown = sorted(set(raw) - set(BY_NAME))
    if unknown:
        raise ValidationError(f"unknown setting {unknown[0]!r}")
    for name, value in raw.items():
        _check_one(BY_NAME[name], value)
    return dict(raw)


def _check_one(s: Setting, value: Any) -> None:
    """One given setting's type and bounds (one-line ValidationError)."""
    checker = _CHECKERS.get(s.value_type)
    if checker is not None:
        checker(s, value)


def _check_number(s: Setting, value: Any) -> None:
    ok_type = not isinstance(value, bool) and isinstance(
        value, (int,) if s.value_type is int else (int, float)
    )
    if not ok_type or not s.low <= value <= s.high:
        what = "an integer" if s.value_type is int else "a number"
        raise ValidationError(
            f"settings.{s.name} must be {what} in {s.low:g}..{s.high:g}, got {value!r}"
        )


def _check_flag(s: Setting, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValidationError(f"settings.{s.name} must be true or false, got {value!r}")


def _check_text(s: Setting, value: Any) -> None:
    if not isinstance(value, str):
        raise ValidationError(f"settings.{s.name} must be a string, got {type(value).__name__}")
    if s.lines and (len(value) > s.max_len or "\0" in value):
        raise ValidationError(f"settings.{s.name} must be text of at most {s.max_len} characters")
    if not s.lines and (len(value) > s.max_len or "\n" in value or "\r" in value):
        raise ValidationError(f"settings.{s.name} must be one line of at most {s.max_len} characters")


def _check_table(s: Setting, value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "\n" not in k + v for k, v in value.items()
    ):
        raise ValidationError(f"settings.{s.name} must be a table of one-line strings")


# each value type's check, by the type a Setting declares
_CHECKERS: dict[type, Callable[[Setting, Any], None]] = {
    int: _check_number, float: _check_number, bool: _check_flag, str: _check_text, dict: _check_table,
}


# --- [follow] and [sitemaps]: what a job crawls beyond the URLs it is given ---------------------

SCOPES = ("site", "domain", "sites")  # the page's host; its registrable domain; the hosts of ``sites``
PARSED_TYPES = ("text/html", "application/xhtml+xml")  # the content types the link parser reads
MAX_LINKS_PER_PAGE = 10_000  # the most ``links_per_page`` may be (and a python downloader may return)
MAX_URL_LENGTH = 2048        # longer found URLs are skipped (browsers and sitemaps stop near here)
MAX_PATTERNS, MAX_SITES = 100, 1000


@dataclass(frozen=True)
class Follow:
    """A validated ``[follow]`` table: which found links a job follows (``common.scope`` decides)."""

    scope: str = "site"
    sites: tuple[str, ...] = ()     # lower-case host names; a subdomain of one is in scope too
    allow: tuple[str, ...] = ()     # regular expressions: when given, a URL must match one
    deny: tuple[str, ...] = ()      # a URL matching one is never followed
    max_depth: int = 3              # links from the seeds are at depth 1
    max_pages: int = 10_000         # pages of the job that following may reach, seeds included
    content_types: tuple[str, ...] = PARSED_TYPES
    links_per_page: int = 1000


@dataclass(frozen=True)
class Sitemaps:
    """A validated ``[sitemaps]`` table: where a job is seeded from."""

    urls: tuple[str, ...] = ()      # sitemap or sitemap index URLs
    robots: bool = False            # also the ``Sitemap:`` lines of the seeds' robots.txt
    lastmod: bool = False           # a page whose lastmod is newer than its last fetch is revisited


FOLLOW_DOC = {
    "scope": f"which hosts: {', '.join(SCOPES)} "
             "(the page's host, its registrable domain, the hosts in sites)",
    "sites": "host names for scope = \"sites\"; their subdomains are in scope too",
    "allow": "regular expressions; when given, a URL must match one (searched anywhere in the URL)",
    "deny": "regular expressions; a URL matching one is never followed",
    "max_depth": "links of the seeds are at depth 1; deeper ones are not followed (0: follow nothing)",
    "max_pages": "pages the job's following may reach, seeds included",
    "content_types": f"content types parsed for links: {', '.join(PARSED_TYPES)}",
    "links_per_page": "links taken from one page, the rest counted and logged "
                      f"(at most {MAX_LINKS_PER_PAGE})",
}
SITEMAPS_DOC = {
    "urls": "sitemap (urlset, index, .xml.gz) URLs the job is seeded from",
    "robots": "also the Sitemap: lines of the seeds' robots.txt",
    "lastmod": "revisit a page when its lastmod is newer than its last fetch (needs settings.revisit)",
}


def _strings(raw: Any, where: str, most: int, max_len: int = 1024) -> tuple[str, ...]:
    if not isinstance(raw, list) or len(raw) > most or not all(
            isinstance(s, str) and s and len(s) <= max_len and "\n" not in s for s in raw):
        raise ValidationError(f"{where} must be a list of at most {most} one-line strings")
    return tuple(raw)


def _int(raw: dict, key: str, where: str, low: int, high: int, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{where}.{key} must be an integer in {low}..{high}, got {value!r}")
    return value


def check_follow(raw: Any) -> Follow | None:
    """The ``[follow]`` table as a Follow (None if absent), or a one-line ValidationError."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError("follow must be a table")
    unknown = sorted(set(raw) - set(FOLLOW_DOC))
    if unknown:
        raise ValidationError(f"unknown follow key {unknown[0]!r}")
    scope = raw.get("scope", "site")
    if scope not in SCOPES:
        raise ValidationError(f"follow.scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    sites = tuple(site_name(s, "follow.sites") for s in _strings(raw.get("sites", []), "follow.sites",
                                                                  MAX_SITES, 253))
    if (scope == "sites") != bool(sites):
        raise ValidationError('follow.sites is needed with scope = "sites", and only then')
    patterns = {}
    for key in ("allow", "deny"):
        patterns[key] = _strings(raw.get(key, []), f"follow.{key}", MAX_PATTERNS)
        for pattern in patterns[key]:
            try:
                url_pattern(pattern)
            except ValueError as exc:
                raise ValidationError(
                    f"follow.{key} pattern {pattern[:80]!r} does not compile: {exc}") from None
    types = _strings(raw.get("content_types", list(PARSED_TYPES)), "follow.content_types", 10, 100)
    for kind in types:
        if kind not in PARSED_TYPES:
            raise ValidationError(f"follow.content_types: {kind[:80]!r} is not parsed for links "
                                  f"(one of {', '.join(PARSED_TYPES)})")
    return Follow(scope=scope, sites=sites, allow=patterns["allow"], deny=patterns["deny"],
                  max_depth=_int(raw, "max_depth", "follow", 0, 10_000, Follow.max_depth),
                  max_pages=_int(raw, "max_pages", "follow", 1, 100_000_000, Follow.max_pages),
                  content_types=tuple(dict.fromkeys(types)),
                  links_per_page=_int(raw, "links_per_page", "follow", 1, MAX_LINKS_PER_PAGE,
                                      Follow.links_per_page))


def check_sitemaps(raw: Any) -> Sitemaps | None:
    """The ``[sitemaps]`` table as a Sitemaps (None if absent), or a one-line ValidationError."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError("sitemaps must be a table")
    unknown = sorted(set(raw) - set(SITEMAPS_DOC))
    if unknown:
        raise ValidationError(f"unknown sitemaps key {unknown[0]!r}")
    urls = _strings(raw.get("urls", []), "sitemaps.urls", 1000, MAX_URL_LENGTH)
    for url in urls:
        try:
            check_url(url, MAX_URL_LENGTH)
        except ValidationError as exc:
            raise ValidationError(f"sitemaps.urls: {url[:80]!r}: {exc}") from None
    flags = {}
    for key in ("robots", "lastmod"):
        flags[key] = raw.get(key, False)
        if not isinstance(flags[key], bool):
            raise ValidationError(f"sitemaps.{key} must be true or false, got {flags[key]!r}")
    if not urls and not flags["robots"]:
        raise ValidationError("sitemaps needs urls or robots = true")
    return Sitemaps(urls=tuple(dict.fromkeys(urls)), robots=flags["robots"], lastmod=flags["lastmod"])
