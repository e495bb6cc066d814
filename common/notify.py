"""Webhooks and mails: queued as ``Notification`` documents, delivered by whoever comes by
(the worker that finished an export, every dispatcher run, idle workers), retried with backoff
up to WEBHOOK_MAX_ATTEMPTS; every attempt is written to ``notification_log``.

A delivery never raises into its caller: dispatching and downloading go on whatever a receiver
or an SMTP server does. A callback URL is read by one parser (``callback_target``) for the check
and for the connection: plain http(s)://host[:port]/path, no user info, backslash, space or
control character that other parsers read differently. Its host is resolved once per attempt,
every address judged (``common/netguard.py``: public only unless WEBHOOK_ALLOW_PRIVATE, never a
service of the cluster) and the POST connects to a judged address, with the name in the Host
header and, for https, in SNI and the certificate check: no second lookup to rebind.
"""
from __future__ import annotations

import json
import logging
import os
import re
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from datetime import timedelta
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import parse_qs, unquote, urlsplit

import certifi
import urllib3

from common import netguard
from common.config import settings
from common.errors import AddressRefused, ValidationError
from common.queue.retry import backoff
from common.secrets import redact
from common.signing import webhook_signature
from common.store import notifications
from common.store.clock import store_now, utcnow
from common.store.records import NotificationRecord

logger = logging.getLogger(__name__)
MAIL_RE = re.compile(r"^[^@\s,<>]+@[^@\s,<>]+\.[^@\s,<>]+$")
# http(s)://host[:port][/path][?query][#fragment]: a host name or an IP (v6 in brackets), nothing
# between "//" and the host, and only printable ASCII without a backslash anywhere
CALLBACK_RE = re.compile(r"(?P<scheme>https?)://(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))"
                         r"(?::(?P<port>[0-9]{1,5}))?(?P<target>[/?#][!-\[\]-~]*)?", re.ASCII | re.IGNORECASE)
WEBHOOK_HINT = "set WEBHOOK_ALLOW_PRIVATE to allow"


@dataclass(frozen=True)
class CallbackTarget:
    scheme: str
    host: str       # a name or an IP, without brackets
    port: int
    target: str     # path and query, as sent in the request line

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == (443 if self.scheme == "https" else 80) else f"{host}:{self.port}"


def check_mail(address: str) -> str:
    if not isinstance(address, str) or len(address) > 254 or not MAIL_RE.match(address):
        raise ValidationError(f"{str(address)[:60]!r} is not an e-mail address")
    return address


def callback_target(url: str) -> CallbackTarget:
    """Where a callback URL points, as the delivery will connect: the one parser of callback URLs."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ValidationError("callback_url must be a URL of at most 2048 characters")
    found = CALLBACK_RE.fullmatch(url)
    if found is None:
        raise ValidationError("callback_url must be http(s)://host[:port]/path in printable ASCII, "
                              "without user info or backslashes")
    scheme, port = (
        found["scheme"].lower(),
        int(found["port"] or (443 if found["scheme"].lower() == "https" else 80)),
    )
    host = (found["ip6"] or found["host"]).lower().rstrip(".")
    if found["ip6"] and netguard.parse_ip(host) is None or not 0 < port < 65536 or not host:
        raise ValidationError("callback_url has an invalid host or port")
    target = (found["target"] or "/").split("#", 1)[0]
    return CallbackTarget(scheme, host, port, target if target.startswith("/") else "/" + target)


def _addresses(target: CallbackTarget) -> list[str]:
    """The judged addresses of ``target``'s host (ValidationError with one line when refused)."""
    try:
        return netguard.resolve(target.host, target.port, settings.WEBHOOK_ALLOW_PRIVATE, WEBHOOK_HINT)
    except AddressRefused:  # never which address a name inside resolves to: only that it is not public
        raise ValidationError(f"callback_url: {target.host} is not a public address "
                              f"({WEBHOOK_HINT})") from None
    except OSError:
        raise ValidationError(f"callback_url: cannot resolve {target.host}") from None


def check_callback(url: str) -> str:
    """``url`` if it is an http(s) URL whose host resolves only to addresses a webhook may reach."""
    _addresses(callback_target(url))
    return url


def queue_webhook(url: str, event: str, payload: dict) -> None:
    notifications.add("webhook", url, event, json.dumps(payload, separators=(",", ":")))


def queue_form(url: str, event: str, form: str) -> None:
    """A callback POSTed as ``application/x-www-form-urlencoded`` (``form``: the body)."""
    notifications.add("form", url, event, form)


def queue_mail(to: str, event: str, subject: str, text: str) -> None:
    if not settings.SMTP_URL:
        logger.info("SMTP_URL is not set: mail %s to %s not sent", event, to)
        return
    notifications.add("mail", to, event, text, subject=subject)


def deliver_due(limit: int = 50) -> int:
    """Attempt the deliveries that are due (each claimed by one process at a time, the claims of
    dead deliverers taken back first: ``common.store.notifications``); how many were delivered.
    Never raises."""
    delivered, owner = 0, f"{settings.HOSTNAME}.{os.getpid()}.{uuid.uuid4().hex[:6]}"
    try:
        notifications.recover(store_now())
    except Exception as exc:  # MongoDB away: try again on the next pass
        logger.warning("notifications not recovered: %s", type(exc).__name__)
        return delivered
    for _ in range(limit):
        try:
            doc = notifications.claim(utcnow(), owner)
        except Exception as exc:  # MongoDB away: try again on the next pass
            logger.warning("notifications not read: %s", type(exc).__name__)
            return delivered
        if doc is None:
            return delivered
        delivered += _attempt(doc)
    return delivered


def _attempt(doc: NotificationRecord) -> int:
    error = None
    try:
        if doc.channel in ("webhook", "form"):
            form = doc.channel == "form"
            content_type = "application/x-www-form-urlencoded" if form else "application/json"
            _post(doc.target, doc.event, doc.body.encode(), content_type)
        else:
            _mail(doc.target, doc.subject, doc.body)
    except Exception as exc:  # any failure of the receiver or the network is retried
        error = (
            redact(f"{type(exc).__name__}: {exc}").splitlines()[0][:500] if str(exc) else type(exc).__name__
        )
    attempt, now = doc.attempts, utcnow()
    try:
        notifications.log_attempt(_shown(doc), doc.channel, doc.event, "SENT" if error is None else "FAIL",
                                  attempt, error)
        if error is None:
            notifications.delivered(doc)
            return 1
        final = attempt >= settings.WEBHOOK_MAX_ATTEMPTS or error.startswith("ValidationError")
        delay = backoff(attempt, base=30, cap=3600, jitter=False)  # the first retry within a minute
        notifications.failed(doc, error, final, now + timedelta(seconds=delay))
    except Exception as exc:
        logger.warning("notification state not written: %s", type(exc).__name__)
    return 0


def _shown(doc: NotificationRecord) -> str:
    """The target as logged: a webhook URL without its query (it may carry a receiver's token)."""
    if doc.channel == "mail":
        return doc.target
    parts = urlsplit(doc.target)
    return redact(
        f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}"
    )


def _post(url: str, event: str, body: bytes, content_type: str = "application/json") -> None:
    """POST to an address judged now (what a name resolves to may have changed since the request),
    connecting to that address, never to the name again."""
    target = callback_target(url)
    headers = {"Host": target.host_header, "Content-Type": content_type,
               "User-Agent": "downcluster-webhook/1.0", "X-Downcluster-Event": event,
               "X-Downcluster-Signature": webhook_signature(body)}
    failure: Exception | None = None
    for address in _addresses(target):  # the next address only when one cannot be connected to
        pool: urllib3.HTTPConnectionPool
        if target.scheme == "https":
            pool = urllib3.HTTPSConnectionPool(address, target.port, server_hostname=target.host,
                                               assert_hostname=target.host, cert_reqs="CERT_REQUIRED",
                                               ca_certs=certifi.where(), timeout=10, retries=False)
        else:
            pool = urllib3.HTTPConnectionPool(address, target.port, timeout=10, retries=False)
        try:
            with pool:
                resp = pool.urlopen("POST", target.target, body=body, headers=headers, redirect=False,
                                    assert_same_host=False, preload_content=True)
        except urllib3.exceptions.NewConnectionError as exc:
            failure = exc
            continue
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"receiver answered HTTP {resp.status}")
        return
    raise failure or RuntimeError("no address to connect to")


def _mail(to: str, subject: str, text: str) -> None:
    url = settings.SMTP_URL
    if not url:
        raise RuntimeError("SMTP_URL is not set")
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
        raise ValidationError("SMTP_URL must be smtp://[user:pass@]host:port or smtps://...")
    starttls = parse_qs(parts.query).get("starttls", ["0"])[0] in ("1", "true", "yes")
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = settings.MAIL_FROM, to, subject
    msg["Date"], msg["Message-ID"] = formatdate(localtime=False), make_msgid(domain="downcluster")
    msg.set_content(text)
    context = ssl.create_default_context()
    client: smtplib.SMTP
    if parts.scheme == "smtps":
        client = smtplib.SMTP_SSL(parts.hostname, parts.port or 465, timeout=15, context=context)
    else:
        client = smtplib.SMTP(parts.hostname, parts.port or 25, timeout=15)
    with client:
        if starttls:
            client.starttls(context=context)
        if parts.username:
            client.login(unquote(parts.username), unquote(parts.password or ""))
        client.send_message(msg)
