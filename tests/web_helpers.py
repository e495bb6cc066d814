"""A real ``downcluster web`` process for the API and console tests."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from services import free_port

BIN = Path(sys.executable).parent


class WebServer:
    def __init__(self, env: dict, **settings: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env, **{f"DOWNCLUSTER_{k}": str(v) for k, v in settings.items()}}

    def __enter__(self) -> "WebServer":
        self.proc = subprocess.Popen([str(BIN / "downcluster"), "web", "--bind", f"127.0.0.1:{self.port}"],
                                     env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("downcluster web exited: " + self.proc.stdout.read()[-2000:])
            try:
                requests.get(self.base + "/api/v1/openapi.json", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError("downcluster web did not answer within 30 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.output = self.proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output = self.proc.communicate()[0]

    def call(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.base + path, headers=headers, timeout=60, **kw)
