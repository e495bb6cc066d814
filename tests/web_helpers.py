"""A real ``downcluster web`` process for the API and console tests."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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
        # The log goes to a file: a pipe nobody reads until the end would fill and stop the server.
        self.log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.proc = subprocess.Popen([str(BIN / "downcluster"), "web", "--bind", f"127.0.0.1:{self.port}"],
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("downcluster web exited: " + self._read()[-2000:])
            try:
                requests.get(self.base + "/api/v1/openapi.json", timeout=1)
                return self
            except (requests.ConnectionError, requests.Timeout):  # a loaded machine: a first answer > 1 s
                time.sleep(0.1)
        raise RuntimeError("downcluster web did not answer within 30 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.output = self._read()
        self.log.close()

    def _read(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def call(self, method: str, path: str, token: str | None = None, **kw) -> requests.Response:
        headers = kw.pop("headers", {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.base + path, headers=headers, timeout=60, **kw)
