"""Sentry through sentry-sdk, with secrets scrubbed from every event."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from common.secrets import SENSITIVE_KEYS, redact

if TYPE_CHECKING:
    from sentry_sdk.types import Event, Hint  # sentry-sdk is imported only when switched on

_initialised = False


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: "[Filtered]" if str(k).lower() in SENSITIVE_KEYS else _scrub(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_scrub(v) for v in value)
    return value


def before_send(event: Event, hint: Hint) -> Event:
    """Redact URL credentials, cookies, proxies and remembered secrets anywhere in the event."""
    return _scrub(event)


def init_sentry(dsn: str, transport: Any = None, **options: Any) -> bool:
    """Initialise sentry-sdk with its RQ integration; an empty DSN switches it off. Its stdlib
    integration stays off: it patches ``subprocess.Popen`` to pass trace headers carrying the
    DSN's public key (``SUBPROCESS_BAGGAGE``) to every child, downloaders included."""
    global _initialised
    if not dsn and transport is None:
        return False
    import sentry_sdk
    from sentry_sdk.integrations.rq import RqIntegration
    from sentry_sdk.integrations.stdlib import StdlibIntegration
    from sentry_sdk.scrubber import DEFAULT_DENYLIST, EventScrubber

    sentry_sdk.init(
        dsn=dsn or None,
        transport=transport,
        integrations=[RqIntegration()],
        disabled_integrations=[StdlibIntegration],
        event_scrubber=EventScrubber(denylist=DEFAULT_DENYLIST + list(SENSITIVE_KEYS), recursive=True),
        before_send=before_send,
        **options,
    )
    _initialised = True
    return True


def capture(exc: BaseException) -> None:
    if _initialised:
        import sentry_sdk

        sentry_sdk.capture_exception(exc)
