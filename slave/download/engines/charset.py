"""The encoding a browser would decode a response body with, stored as ``encoding`` for every
engine: the byte-order mark, then the HTTP charset, then the document's own declaration
(``<meta charset>`` / ``<meta http-equiv>`` in the first bytes, the WHATWG prescan; an XML
declaration), then detection. w3lib (Scrapy's library) does the first three, in that order, as
its ``html_to_unicode`` does; charset-normalizer (requests') detects. A stylesheet's leading
``@charset`` counts as its declaration (CSS Syntax). Bodies that are not text (images,
archives, PDF, ...) have no encoding: None.

Names are Python codec names (``utf-8``, ``cp1251``, ``cp932`` for Shift_JIS as WHATWG maps it),
so ``bytes.decode(encoding)`` reads the text as a browser shows it.
"""
from __future__ import annotations

import re

import charset_normalizer
from w3lib.encoding import html_body_declared_encoding, http_content_type_encoding, read_bom, resolve_encoding

DETECT_BYTES = 64 * 1024   # detection looks at the start of the body only
_CSS_CHARSET = re.compile(rb'^@charset "([A-Za-z0-9_.:-]{1,40})";')
_TEXT_SUFFIXES = ("+xml", "/xml", "+json", "/json", "/javascript", "/ecmascript", "/x-javascript")


def media_type(headers) -> str:
    for key, value in (headers or {}).items():
        if str(key).lower() == "content-type":
            return str(value)
    return ""


def is_text(content_type: str) -> bool:
    main = content_type.split(";", 1)[0].strip().lower()
    return main.startswith("text/") or main.endswith(_TEXT_SUFFIXES)


def detect(body: bytes) -> str | None:
    """UTF-8 when the start of ``body`` is valid UTF-8 (ASCII included: a C-speed check, far
    cheaper than charset-normalizer, docs/benchmarks.md), else charset-normalizer's best guess,
    or None."""
    if not body:
        return None
    head = body[:DETECT_BYTES]
    try:
        head.decode("utf-8")
        return "utf-8"
    except UnicodeDecodeError as exc:
        if len(body) > DETECT_BYTES and exc.start >= len(head) - 3 and exc.reason == "unexpected end of data":
            return "utf-8"  # valid up to a character cut by the 64 KB window
    best = charset_normalizer.from_bytes(head).best()
    if best is None:
        return None
    if best.encoding in ("ascii", "utf_8"):
        return "utf-8"
    return resolve_encoding(best.encoding) or best.encoding


def body_encoding(headers, body: bytes) -> str | None:
    """The encoding of ``body`` as a browser would find it (see the module docstring)."""
    content_type = media_type(headers)
    bom, _ = read_bom(body)
    if bom is not None:
        return bom
    if content_type and not is_text(content_type):
        return None
    declared = http_content_type_encoding(content_type) if content_type else None
    if declared is not None:
        return declared + "-be" if declared in ("utf-16", "utf-32") else declared
    if content_type.split(";", 1)[0].strip().lower() == "text/css":
        match = _CSS_CHARSET.match(body)
        if match:
            return resolve_encoding(match.group(1).decode("ascii")) or "utf-8"
    declared = html_body_declared_encoding(body)
    if declared is not None:
        return declared
    found = detect(body)
    if found is None and content_type:  # text with nothing to go by: the web's default
        return "utf-8"
    return found
