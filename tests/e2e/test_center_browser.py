"""The center's browser channel as its callers' pages open it: Chromium, on a page of another
origin, opens the center's WebSocket with no token and no cookie, sends ``download|<task id>``
and is told when the task succeeded."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.test_console_browser import CHROMIUM, DRIVER, browser  # noqa: F401 - the fixture
from tests.helpers import burst_worker
from tests.integration.test_center_v1 import backend, center, task  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver"),
]

PAGE = """<!doctype html><html><body><p id="out"></p><script>
const out = document.getElementById("out");
const ws = new WebSocket(%s);
ws.onopen = () => ws.send(%s);
ws.onmessage = (e) => { out.textContent = e.data; };
ws.onerror = () => { out.textContent = "error"; };
</script></body></html>"""


def _shop(page: str) -> ThreadingHTTPServer:
    """The caller's own site: another origin (``localhost``, another port) serving ``page``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_page_of_another_origin_hears_its_task_succeed(center, backend, browser):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cluster, web, caller = center
    task_id = caller.post("/v1/task", task(backend, n=5))["data"]["task_id"]
    ws_url = web.base.replace("http://", "ws://") + "/download/notice"
    shop = _shop(PAGE % (json.dumps(ws_url), json.dumps(f"download|{task_id}")))
    try:
        browser.get(f"http://localhost:{shop.server_address[1]}/orders")  # not the center's origin
        runner = threading.Thread(target=burst_worker, args=(cluster,))
        runner.start()
        try:
            said = WebDriverWait(browser, 90).until(
                lambda d: d.find_element(By.ID, "out").text or None)
        finally:
            runner.join(120)
    finally:
        shop.shutdown()
        shop.server_close()
    assert json.loads(said) == {"code": 200, "msg": "任务处理成功", "data": {"status": 4}}
