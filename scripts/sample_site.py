"""A small loopback HTTP site for tests, the demo and the benchmark.

Routes are deterministic so callers can compute expected bytes (``page_body``); others
misbehave on purpose (errors, redirects, bombs, trickles, resets, odd encodings).
"""
from __future__ import annotations

import argparse
import json
import random
import select
import socket
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

SHIFT_JIS_BODY = "<html><body>日本語のページです</body></html>".encode("shift_jis")
INVALID_UTF8_BODY = b"ok \xff\xfe\x80 bad"
LATIN1_BODY = "caf\xe9 cr\xe8me".encode("latin-1")
# Pages that declare their charset only in the document (as nginx serves them: no charset in
# Content-Type), a BOM contradicting the header, XML, CSS, a binary: what a browser would decode.
CHARSET_TEXT = {
    "utf-8": "«Grüße» ’quoted’ — 日本",
    "shift_jis": "日本語のページです",
    "windows-1251": "Привет, мир",
}


def charset_page(label: str, http_equiv: bool = False) -> bytes:
    meta = (f'<meta http-equiv="Content-Type" content="text/html; charset={label}">' if http_equiv
            else f'<meta charset="{label}">')
    return (f"<!DOCTYPE html><html><head>{meta}<title>t</title></head>"
            f"<body><p>{CHARSET_TEXT[label]}</p></body></html>").encode(label)


CHARSET_ROUTES = {  # path -> (content type, body)
    "meta-utf-8": ("text/html", charset_page("utf-8")),
    "meta-shift_jis": ("text/html", charset_page("shift_jis")),
    "meta-windows-1251": ("text/html", charset_page("windows-1251")),
    "equiv-windows-1251": ("text/html", charset_page("windows-1251", http_equiv=True)),
    "bom": ("text/html; charset=iso-8859-1", b"\xef\xbb\xbf<p>" + CHARSET_TEXT["utf-8"].encode() + b"</p>"),
    "xml": ("application/xml", '<?xml version="1.0" encoding="Shift_JIS"?><a>日本語</a>'.encode("shift_jis")),
    "css": ("text/css", "p::before { content: \"«Grüße»\" }".encode()),
    "css-charset": ("text/css",
                    '@charset "windows-1251";\np::before { content: "Привет" }'.encode("windows-1251")),
    "png": ("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))),
}
PDF_BODY = b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n" + bytes(range(256))
_flaky: dict[str, int] = {}
_flaky_lock = threading.Lock()
_bomb: bytes | None = None
_bomb_lock = threading.Lock()
MiB = 1024 * 1024


def page_body(n: int) -> bytes:
    """The ~2 KB page served at /page/<n>."""
    filler = "".join(f"<p>row {n}-{i} lorem ipsum dolor sit amet</p>\n" for i in range(50))
    return f"<html><head><title>page {n}</title></head><body>\n{filler}</body></html>\n".encode()


def linked_page(n: int) -> bytes:
    """The page at /links/<n>: an endless binary tree (page n links to 2n+1 and 2n+2, only a crawl's
    caps end it), with a base href, a fragment and links no crawler follows."""
    return (f"<html><head><base href='/links/'><link rel=next href='{n + 1}'></head><body>"
            f"<a href='{2 * n + 1}#top'>left</a> <a href=\"{2 * n + 2}\">right</a> <a href='#x'>here</a> "
            "<a href='mailto:x@example.com'>mail</a> <a href='javascript:void(0)'>js</a>"
            "</body></html>").encode()


# Pages built by JavaScript, for the browser engine (/js/<kind>[/<n>]).
JS_PAGES = {
    # the text exists only after a script ran
    "render": ("<!doctype html><html><head><title>js {n}</title></head><body><div id='out'>loading</div>"
               "<script>setTimeout(function () {{ document.getElementById('out').textContent = "
               "'rendered by javascript ' + {n}; }}, 50);</script></body></html>"),
    # a button that adds content when clicked
    "button": ("<!doctype html><html><body><ul id='items'><li>first</li></ul>"
               "<button id='more' onclick=\"var li=document.createElement('li');li.textContent='second';"
               "document.getElementById('items').appendChild(li)\">more</button></body></html>"),
    # the load event never comes: an image that never finishes
    "never-loads": "<!doctype html><html><body>waiting<img src='/hang'></body></html>",
    # a modal dialog on load
    "alert": ("<!doctype html><html><body><p id='p'>before</p><script>alert('hello'); confirm('sure?');"
              "document.getElementById('p').textContent = 'after the dialogs';</script></body></html>"),
    # allocates without end
    "oom": ("<!doctype html><html><body><script>"
            "var a = []; while (true) { a.push(new Array(1e6).fill(1.5)); }"
            "</script></body></html>"),
    # navigates to a file:// URL
    "to-file": "<!doctype html><html><body><script>location.href = 'file:///etc/passwd';</script></body></html>",
}


def js_page(kind: str, n: int = 0) -> bytes:
    return JS_PAGES[kind].replace("{n}", str(n)).replace("{{", "{").replace("}}", "}").encode()


def bytes_body(n: int) -> bytes:
    """The n pseudo-random bytes served at /bytes/<n> (seeded by n)."""
    return random.Random(n).randbytes(n)


def gzip_bomb() -> bytes:
    """One valid gzip member (about 1 MB) that inflates to 1 GiB of zeros, built once.

    Compressing 1 GiB takes ~6 s, so one 1 MiB deflate block ending in a full flush (which
    makes what follows independent of what came before) is repeated, then framed by hand.
    """
    global _bomb
    with _bomb_lock:
        if _bomb is None:
            zeros = b"\0" * MiB
            comp = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: we write the gzip framing
            block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
            crc = 0
            for _ in range(1024):
                crc = zlib.crc32(zeros, crc)
            header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # magic, deflate, no flags/mtime, OS unknown
            trailer = struct.pack("<II", crc, (1024 * MiB) & 0xFFFFFFFF)
            _bomb = header + block * 1024 + comp.flush() + trailer
    return _bomb


class Traffic:
    """What the site saw, for the etiquette tests: requests per path, and per Host header the
    request start times and the most requests in flight at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.hits: dict[str, int] = {}
            self.starts: dict[str, list[float]] = {}
            self.active: dict[str, int] = {}
            self.peak: dict[str, int] = {}
            self.hung_up: dict[str, int] = {}  # per Host header: /linger requests the client ended early

    def begin(self, host: str, path: str) -> None:
        with self.lock:
            self.hits[path] = self.hits.get(path, 0) + 1
            self.starts.setdefault(host, []).append(time.monotonic())
            self.active[host] = self.active.get(host, 0) + 1
            self.peak[host] = max(self.peak.get(host, 0), self.active[host])

    def end(self, host: str) -> None:
        with self.lock:
            self.active[host] -= 1


TRAFFIC = Traffic()
# /versioned/<key>: a page whose content a test changes. key -> [version, validators] where
# validators is "etag" (ETag, answers If-None-Match with 304), "date" (Last-Modified, answers
# If-Modified-Since) or "none" (the same body again when unchanged); ANSWERS[key]: codes sent.
VERSIONED: dict[str, list] = {}
ANSWERS: dict[str, list[int]] = {}
HANG_NEXT: set[str] = set()  # keys whose next request hangs for 60 s (a worker killed mid-visit)


def versioned_body(key: str, version: int, size: int = 0) -> bytes:
    """The page ``key`` at ``version``, padded to about ``size`` bytes."""
    text = f"<html><body><h1>{key}</h1><p>version {version}</p>"
    return (text + "x" * max(0, size - len(text) - 14) + "</body></html>").encode()
ROBOTS: dict[int, tuple[int, str]] = {}  # server port -> (status, robots.txt text); default 404


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay_ms = 0

    def log_message(self, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # headers and body go out as two writes: without this, Nagle's algorithm holds the body
        # for the client's delayed ACK (~40 ms) on a kept-alive connection
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _send(self, code: int, body: bytes, ctype: str = "text/plain", headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if code not in (204, 304):
            self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if code not in (204, 304):
            self.wfile.write(body)

    def do_GET(self) -> None:
        host = self.headers.get("Host", "")
        TRAFFIC.begin(host, self.path)
        try:
            self._route()
        finally:
            TRAFFIC.end(host)

    def _route(self) -> None:  # noqa: C901 - a route table
        if self.delay_ms:
            time.sleep(self.delay_ms / 1000)
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        head, arg = parts[0], parts[1] if len(parts) > 1 else ""
        try:
            if head == "page":
                self._send(200, page_body(int(arg)), "text/html; charset=utf-8")
            elif head == "robots.txt":
                status, text = ROBOTS.get(self.server.server_address[1], (404, "no robots.txt"))
                self._send(status, text.encode(), "text/plain")
            elif head == "hold":  # answers after <ms>, for concurrency counts
                time.sleep(int(arg) / 1000)
                self._send(200, f"held {self.path}".encode())
            elif head == "linger":
                # like hold, but ends as soon as the client hangs up: in flight as the site sees it
                if not select.select([self.connection], [], [], int(arg) / 1000)[0]:
                    self._send(200, f"held {self.path}".encode())
                else:
                    self.close_connection = True
                    with TRAFFIC.lock:
                        host = self.headers.get("Host", "")
                        TRAFFIC.hung_up[host] = TRAFFIC.hung_up.get(host, 0) + 1
            elif head == "links":
                self._send(200, linked_page(int(arg)), "text/html; charset=utf-8")
            elif head == "js":
                page = js_page(arg, int(parts[2]) if len(parts) > 2 else 0)
                self._send(200, page, "text/html; charset=utf-8")
            elif head == "bytes":
                self._send(200, bytes_body(int(arg)), "application/octet-stream")
            elif head == "stream":
                self._stream(int(arg))
            elif head == "status":
                self._send(int(arg), f"status {arg}".encode())
            elif head == "retry-after":
                self._send(503, b"busy", headers={"Retry-After": arg})
            elif head == "flaky":
                key, k = arg, int(parts[2])
                with _flaky_lock:
                    _flaky[key] = _flaky.get(key, 0) + 1
                    seen = _flaky[key]
                self._send(500, b"flaky") if seen <= k else self._send(200, f"ok {key}".encode())
            elif head == "hang-once":  # the first request for a key hangs, later ones answer
                with _flaky_lock:
                    _flaky["hang:" + arg] = _flaky.get("hang:" + arg, 0) + 1
                    first = _flaky["hang:" + arg] == 1
                if first:
                    time.sleep(600)
                self._send(200, page_body(0), "text/html; charset=utf-8")
            elif head == "slow":
                self._trickle()
            elif head == "hang":
                self.send_response(200)
                self.send_header("Content-Length", "10")
                self.end_headers()
                self.wfile.flush()
                time.sleep(600)
            elif head == "redirect":
                n = int(arg)
                self._redirect(f"/redirect/{n - 1}") if n > 0 else self._send(200, b"done")
            elif head == "redirect-loop":
                self._redirect("/redirect-loop")
            elif head == "redirect-file":
                self._redirect("file:///etc/passwd")
            elif head == "redirect-to":
                self._redirect(parse_qs(url.query)["url"][0])
            elif head == "gzip-bomb":
                self._send(200, gzip_bomb(), "text/plain", {"Content-Encoding": "gzip"})
            elif head == "charset":
                ctype, body = CHARSET_ROUTES[arg]
                self._send(200, body, ctype)
            elif head == "shift_jis":
                self._send(200, SHIFT_JIS_BODY, "text/html; charset=shift_jis")
            elif head == "invalid-utf8":
                self._send(200, INVALID_UTF8_BODY, "text/plain; charset=utf-8")
            elif head == "wrong-charset":
                self._send(200, LATIN1_BODY, "text/plain; charset=utf-8")
            elif head == "pdf":
                self._send(200, PDF_BODY, "application/pdf")
            elif head == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
            elif head == "versioned":
                self._versioned(arg)
            elif head == "echo":  # the query's ``body`` as a text page (stored values of a test's choosing)
                self._send(200, parse_qs(url.query)["body"][0].encode(), "text/plain; charset=utf-8")
            elif head == "headers":
                self._send(200, json.dumps(dict(self.headers.items())).encode(), "application/json")
            else:
                self._send(404, b"not found")
        except (ValueError, IndexError, KeyError):  # a malformed argument, found before anything was sent
            self._send(404, b"not found")
        except OSError:  # the client went away: stop quietly
            self.close_connection = True

    def _versioned(self, key: str) -> None:
        version, validators, *size = VERSIONED.setdefault(key, [1, "etag"])
        if key in HANG_NEXT:
            HANG_NEXT.discard(key)
            ANSWERS.setdefault(key, []).append(0)
            time.sleep(60)
            return
        etag = f'"{key}-v{version}"'
        stamp = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(1_700_000_000 + version * 3600))
        fresh = (validators == "etag" and self.headers.get("If-None-Match") == etag) or (
            validators == "date" and self.headers.get("If-Modified-Since") == stamp)
        headers = {"etag": {"ETag": etag}, "date": {"Last-Modified": stamp}}.get(validators, {})
        code = 304 if fresh else 200
        ANSWERS.setdefault(key, []).append(code)
        self._send(code, b"" if fresh else versioned_body(key, version, *size[:1]), "text/html", headers)

    def _redirect(self, location: str) -> None:
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _stream(self, n: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"x" * 65536  # generated on the fly: n may be gigabytes
        left = n
        while left > 0:
            part = chunk[: min(65536, left)]
            self.wfile.write(b"%x\r\n" % len(part))
            self.wfile.write(part)
            self.wfile.write(b"\r\n")
            left -= len(part)
        self.wfile.write(b"0\r\n\r\n")

    def _trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "600")
        self.end_headers()
        for _ in range(600):
            self.wfile.write(b"x")
            self.wfile.flush()
            time.sleep(1)


class Server(ThreadingHTTPServer):
    """Daemon thread per connection; never joins them (/hang would block for 600 s)."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 512

    def handle_error(self, request, client_address) -> None:
        """Quiet about clients hanging up (tests do it on purpose); loud about anything else."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


def start_site(host: str = "127.0.0.1", port: int = 0, delay_ms: int = 0):
    """Start the site in a background thread; return (server, base_url). ``server.shutdown()`` stops it."""
    handler = type("SiteHandler", (Handler,), {"delay_ms": delay_ms})
    server = Server((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="sample-site").start()
    return server, f"http://{host}:{server.server_address[1]}"


def start_sites(hosts: int, port: int, delay_ms: int = 0) -> list:
    """The site on 127.0.0.1 .. 127.0.0.<hosts>, one port: distinct hosts for per-host limits
    (Linux routes all of 127.0.0.0/8 to the loopback interface)."""
    return [start_site(f"127.0.0.{i}", port, delay_ms)[0] for i in range(1, hosts + 1)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--hosts", type=int, default=1, help="serve on 127.0.0.1 .. 127.0.0.N (same port)")
    args = parser.parse_args()
    servers = start_sites(args.hosts, args.port, args.delay_ms)
    print(f"sample site on http://127.0.0.1:{args.port} ({args.hosts} loopback address(es))", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        for srv in servers:
            srv.shutdown()
