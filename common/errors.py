"""The error tree of downcluster.

    DownclusterError
    ├── ConfigError          a setting cannot be read (not retryable)
    ├── ValidationError      a manifest, downloader, URL or setting is invalid (not retryable)
    │   ├── NotFound         the named job, task, export or document does not exist (or is
    │   │                    another project's: its existence is never told)
    │   ├── Forbidden        the caller sees it, but its role may not do that (HTTP 403)
    │   └── Conflict         it exists, but its state forbids the action (cancel a finished export)
    ├── DispatchLocked       another dispatcher holds the cluster lock (retry on the next run)
    ├── SourceFailed         a download task's source_url answered badly after its retries (not retryable)
    └── DownloadError        one download failed; ``retryable`` says whether to try again
        └── AddressRefused   the address connected to is not one the cluster may reach (not retryable)

Mapped once (``ANSWERS``) to HTTP statuses (the API, the dispatcher's child) and exit codes (the CLI).
"""
from __future__ import annotations

import sys


class DownclusterError(Exception):
    """Root of every error downcluster raises on purpose."""


class ConfigError(DownclusterError):
    """A setting is missing or malformed. Not retryable: fix the configuration."""


class ValidationError(DownclusterError):
    """Input from a person (manifest, code, URL, setting) is invalid. Not retryable."""


def too_many_digits(what: str) -> ValidationError:
    """The one line for an integer past Python's limit for reading one from text: json and
    tomllib raise a bare ValueError for it (not their decode error), so each parser of input
    catches ValueError after its decode error and answers this."""
    return ValidationError(f"{what}: a number has more than {sys.get_int_max_str_digits()} digits")


class NotFound(ValidationError):
    """What a request names (a job, an export, a document) does not exist."""


class Forbidden(ValidationError):
    """The caller sees what it names but its role may not do that (an analyst changing a job)."""


class Conflict(ValidationError):
    """The named thing exists but is in a state that forbids the action (HTTP 409)."""


class SourceFailed(DownclusterError):
    """A download task's source (``source_url``) answered badly — an error status, a timeout, HTML
    or JSON of the wrong shape, a total it did not keep — through all its tries. Not retryable:
    the task fails with this one line."""


class DispatchLocked(DownclusterError):
    """Another dispatcher run holds the cluster-wide lock. Safe to retry later."""


class DownloadError(DownclusterError):
    """A download failed. ``retryable`` tells whether a later attempt may succeed;
    ``retry_after`` is a server-requested delay in seconds, if any."""

    def __init__(self, reason: str, retryable: bool = True, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after


class AddressRefused(DownloadError):
    """A request would reach an address the cluster refuses (loopback, private, link-local, one
    of its own services; see ``common/netguard.py``). Not retryable: the address is the answer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, retryable=False)


EXIT_INVALID = 2
EXIT_LOCKED = 75  # EX_TEMPFAIL: another dispatcher holds the lock; cron may simply go on

# The one mapping: (class, HTTP status, exit code); the first class an error is an instance of answers.
# Any other error is a failure: 503 / exit 1 for a service unreachable, else 500 and Sentry.
ANSWERS: tuple[tuple[type[DownclusterError], int, int], ...] = (
    (NotFound, 404, EXIT_INVALID),
    (Forbidden, 403, EXIT_INVALID),
    (Conflict, 409, EXIT_INVALID),
    (ValidationError, 422, EXIT_INVALID),
    (ConfigError, 422, EXIT_INVALID),
    (DispatchLocked, 409, EXIT_LOCKED),
)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of an error of the tree; None for any other error."""
    return next((status for cls, status, _ in ANSWERS if isinstance(exc, cls)), None)


def exit_code(exc: BaseException) -> int | None:
    """The CLI exit code of an error of the tree; None for any other error."""
    return next((code for cls, _, code in ANSWERS if isinstance(exc, cls)), None)
