"""Real receivers for notifications: an SMTP server (aiosmtpd) and an HTTP webhook receiver,
both on free loopback ports, recording what they get."""
from __future__ import annotations

import threading
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from services import free_port


class SmtpServer:
    """aiosmtpd's Controller: a real SMTP server in a thread; ``messages`` are parsed emails."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Message] = []
        self.port = free_port()
        outer = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                outer.messages.append(message_from_bytes(envelope.content))
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def __enter__(self) -> "SmtpServer":
        self.controller.start()
        return self

    def __exit__(self, *exc) -> None:
        self.controller.stop()


class WebhookReceiver:
    """Answers each POST (or GET) with the next of ``statuses`` (then 200) and records (headers, body)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[tuple[dict, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST  # a stand-in for any HTTP service that must not be reached

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?key=receiver-secret"

    def __enter__(self) -> "WebhookReceiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
