"""The failure tree of a download: one class per way a download fails, each carrying its data.

Every failure is a ``common.errors.DownloadError``: ``reason`` is the one line people read (stored
as the task's ``failed_reason``, byte for byte as before), ``retryable`` whether a later attempt
may succeed, ``retry_after`` a delay the server asked for. What the cluster *does* with a failure
reads its class, never its text: ``label`` is its metric class (``common.metrics``), a
``HttpStatus`` with ``pauses_site`` pauses its site, an ``OutOfScope`` is logged as not followed.

    DownloadError (common.errors; label "other")
      AddressRefused (common.errors)  the address is one the cluster refuses       "connection"
      Timeout                         the time limit, or a connect/read timeout     "timeout"
      ConnectFailed                   DNS, refused, reset, TLS, proxy, broken body  "connection"
      TooLarge(limit)                 a body or output above its limit              "too_large"
      Invalid                         the URL or request cannot be sent             "invalid"
      HttpStatus(code)                a final status that is no success             "http_4xx"/"http_5xx"
      TooManyRedirects                                                              "other"
      OutOfScope(target)              a redirect of a following job out of scope    "other"
      RobotsDisallowed                                                              "robots"
      BadResponse                     an answer that is no page (no response, a bad encoding)
      DownloaderFailed                a python/shell downloader failed or is unavailable "downloader"
        SandboxKilled(signal)         killed by a signal (a resource limit, or another)
      EngineCrashed                   a bug of an engine: the task fails, not the entry
      EtiquetteUnavailable            Redis failed the etiquette: handed back
"""
from __future__ import annotations

from common.errors import DownloadError

OUT_OF_SCOPE = "redirect out of the job's scope"  # how an OutOfScope's reason begins


class Timeout(DownloadError):
    label = "timeout"


class ConnectFailed(DownloadError):
    label = "connection"


class TooLarge(DownloadError):
    label = "too_large"

    def __init__(self, reason: str, limit: int) -> None:
        super().__init__(reason, retryable=False)
        self.limit = limit


class Invalid(DownloadError):
    label = "invalid"


class HttpStatus(DownloadError):
    """A final status that is no success; ``pauses_site``: the site asked for a pause (429, 503
    with a Retry-After) and every worker leaves it alone for ``retry_after`` seconds."""

    def __init__(self, code: int, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {code}", retryable=retryable, retry_after=retry_after)
        self.code = code
        self.label = {4: "http_4xx", 5: "http_5xx"}.get(code // 100, "other")

    @property
    def pauses_site(self) -> bool:
        return self.code in (429, 503) and bool(self.retry_after)


class TooManyRedirects(DownloadError):
    pass


class OutOfScope(DownloadError):
    def __init__(self, target: str, why: str) -> None:
        super().__init__(f"{OUT_OF_SCOPE} to {target[:300]}: {why}", retryable=False)
        self.target = target


class RobotsDisallowed(DownloadError):
    label = "robots"

    def __init__(self) -> None:
        super().__init__("robots.txt disallows", retryable=False)


class BadResponse(DownloadError):
    pass


class DownloaderFailed(DownloadError):
    label = "downloader"


class SandboxKilled(DownloaderFailed):
    def __init__(self, reason: str, signal: int, retryable: bool) -> None:
        super().__init__(reason, retryable=retryable)
        self.signal = signal


class EngineCrashed(DownloadError):
    pass


class EtiquetteUnavailable(DownloadError):
    pass


def retyped(error: DownloadError, reason: str) -> DownloadError:
    """``error`` with its reason replaced (a secret redacted from it), its class and data kept."""
    copy = DownloadError.__new__(type(error))
    copy.__dict__.update(error.__dict__)
    Exception.__init__(copy, reason)
    copy.reason = reason
    return copy


# an engine's reading of an exception it caught: (failure class, reason, retryable)
Classified = tuple[type[DownloadError], str, bool]
