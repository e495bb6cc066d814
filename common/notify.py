"""Webhooks and mails: queued as ``Notification`` documents, delivered by whoever comes by
(the worker that finished an export, every dispatcher run, idle workers), retried with backoff
up to WEBHOOK_MAX_ATTEMPTS; every attempt is written to ``notification_log``.

A delivery never raises into its caller: dispatching and downloading go on whatever a receiver
or an SMTP server does. Callbacks must be http(s) and, unless WEBHOOK_ALLOW_PRIVATE, resolve
only to public addresses (checked at request time and again before each attempt).
"""
from __future__ import annotations

import ipaddress
import json
import logging
import re
import smtplib
import socket
import ssl
from datetime import timedelta
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from urllib.parse import parse_qs, unquote, urlsplit

import requests

from common.config import settings
from common.errors import ValidationError
from common.models import FAIL, PENDING, SUCCESS, Notification, NotificationLog, utcnow
from common.retry import backoff
from common.secrets import redact
from common.signing import webhook_signature

logger = logging.getLogger(__name__)
MAIL_RE = re.compile(r"^[^@\s,<>]+@[^@\s,<>]+\.[^@\s,<>]+$")
CLAIM = timedelta(seconds=120)


def check_mail(address: str) -> str:
    if not isinstance(address, str) or len(address) > 254 or not MAIL_RE.match(address):
        raise ValidationError(f"{str(address)[:60]!r} is not an e-mail address")
    return address


def check_callback(url: str) -> str:
    """``url`` if it is an http(s) URL whose host resolves to public addresses only."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ValidationError("callback_url must be a URL of at most 2048 characters")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValidationError("callback_url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError("callback_url must be an http:// or https:// URL with a host")
    if settings.WEBHOOK_ALLOW_PRIVATE:
        return url
    try:
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise ValidationError(f"callback_url: cannot resolve {parts.hostname}") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%")[0])
        if not ip.is_global or ip.is_multicast:
            raise ValidationError(f"callback_url: {parts.hostname} is a loopback or private address "
                                  "(set WEBHOOK_ALLOW_PRIVATE to allow)")
    return url


def queue_webhook(url: str, event: str, payload: dict) -> None:
    Notification(kind="webhook", target=url, event=event, body=json.dumps(payload, separators=(",", ":"))).save()


def queue_mail(to: str, event: str, subject: str, text: str) -> None:
    if not settings.SMTP_URL:
        logger.info("SMTP_URL is not set: mail %s to %s not sent", event, to)
        return
    Notification(kind="mail", target=to, event=event, subject=subject, body=text).save()


def deliver_due(limit: int = 50) -> int:
    """Attempt the deliveries that are due (each claimed by one process at a time); how many were
    delivered. Never raises."""
    delivered = 0
    coll = Notification._get_collection()
    for _ in range(limit):
        now = utcnow()
        try:
            doc = coll.find_one_and_update(
                {"state": PENDING, "next_at": {"$lte": now},
                 "$or": [{"claimed_until": None}, {"claimed_until": {"$lt": now}}]},
                {"$set": {"claimed_until": now + CLAIM}, "$inc": {"attempts": 1}}, return_document=True)
        except Exception as exc:  # MongoDB away: try again on the next pass
            logger.warning("notifications not read: %s", type(exc).__name__)
            return delivered
        if doc is None:
            return delivered
        delivered += _attempt(coll, doc)
    return delivered


def _attempt(coll, doc: dict) -> int:
    error = None
    try:
        if doc["kind"] == "webhook":
            _post(doc["target"], doc["event"], doc["body"].encode())
        else:
            _mail(doc["target"], doc["subject"], doc["body"])
    except Exception as exc:  # any failure of the receiver or the network is retried
        error = redact(f"{type(exc).__name__}: {exc}").splitlines()[0][:500] if str(exc) else type(exc).__name__
    attempt, now = doc["attempts"], utcnow()
    try:
        NotificationLog(target=_shown(doc), kind=doc["kind"], event=doc["event"], status="SENT" if error is None else "FAIL",
                        attempt=attempt, error=error).save()
        if error is None:
            coll.update_one({"_id": doc["_id"]}, {"$set": {"state": SUCCESS, "last_error": None}, "$unset": {"claimed_until": 1}})
            return 1
        final = attempt >= settings.WEBHOOK_MAX_ATTEMPTS or error.startswith("ValidationError")
        delay = backoff(attempt, base=30, cap=3600, jitter=False)  # the first retry within a minute
        coll.update_one({"_id": doc["_id"]}, {"$set": {"state": FAIL if final else PENDING, "last_error": error,
                                                       "next_at": now + timedelta(seconds=delay)},
                                              "$unset": {"claimed_until": 1}})
    except Exception as exc:
        logger.warning("notification state not written: %s", type(exc).__name__)
    return 0


def _shown(doc: dict) -> str:
    """The target as logged: a webhook URL without its query (it may carry a receiver's token)."""
    if doc["kind"] != "webhook":
        return doc["target"]
    parts = urlsplit(doc["target"])
    return redact(f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}{parts.path}")


def _post(url: str, event: str, body: bytes) -> None:
    check_callback(url)  # again: what a name resolves to may have changed since the request
    resp = requests.post(url, data=body, timeout=10, allow_redirects=False, headers={
        "Content-Type": "application/json", "User-Agent": "downcluster-webhook/1.0",
        "X-Downcluster-Event": event, "X-Downcluster-Signature": webhook_signature(body)})
    resp.close()
    if not 200 <= resp.status_code < 300:
        raise RuntimeError(f"receiver answered HTTP {resp.status_code}")


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
