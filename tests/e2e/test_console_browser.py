"""The console in headless Chromium (Debian's chromium + chromium-driver, driven by selenium;
nothing is downloaded at run time): sign in, queues and jobs, disable a job, requeue a DEAD
task, open a body preview, an export whose state arrives over its WebSocket, a screenshot of the
overview under var/ that is not blank."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from common.store.counts import recount
from common.store.models import CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, cli, register, statuses, write_job
from tests.web_helpers import WebServer

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver"),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium manager must never fetch a driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


def wait_text(driver, css: str, text: str, timeout: float = 15) -> str:
    """The text of the first element matching ``css`` that contains ``text`` (the console
    redraws its view every few seconds, so elements are looked up again until then)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def found(d):
        return next((t for t in (e.text for e in d.find_elements(By.CSS_SELECTOR, css)) if text in t), None)
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(found)


def jobs_shown(driver) -> list[str]:
    """The job names the jobs view lists now (its first column's links)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return [a.text for a in driver.find_elements(By.CSS_SELECTOR, "#view table td a")]
    except StaleElementReferenceException:
        return []


def click(driver, xpath: str, timeout: float = 15) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def clicked(d):
        found = d.find_elements(By.XPATH, xpath)
        if found:
            found[0].click()
            return True
        return False
    WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(clicked)


def png_variety(png: bytes) -> int:
    """Distinct byte values in a PNG's pixel data: a blank page has a handful, a page with text hundreds."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, data = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(data)))


def test_console_in_headless_chromium(cluster, browser, tmp_path):
    from selenium.webdriver.common.by import By

    register(tmp_path, "site")
    add_urls("site", [f"{cluster.site}/page/{i}" for i in range(3)])
    assert dispatch_once(cluster.redis).total == 3
    worker = subprocess.run([str(BIN / "downcluster"), "worker", "--burst"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, **cluster.env})
    assert worker.returncode == 0, worker.stderr[-2000:]
    add_urls("site", [f"{cluster.site}/status/500/dead", f"{cluster.site}/page/9"])
    CrawlerTask._get_collection().update_one({"uri": f"{cluster.site}/status/500/dead"}, {"$set": {
        "status": "DEAD", "download_times": 3, "failed_reason": "HTTP 500 (recovered 3 times)"}})
    recount()  # set behind the product's back: counted again as `downcluster stats --recount` does
    assert dispatch_once(cluster.redis).total == 1  # one entry waits in down_low
    assert cli("project", "create", "team-b").exit_code == 0  # a second project, with a job of its own
    other = write_job(tmp_path, "other-team")
    assert cli("job", "register", str(other), "--project", "team-b").exit_code == 0
    token = cli("token", "create", "console", "--role", "admin").stdout.strip().splitlines()[-1]

    with WebServer(cluster.env) as web:
        browser.get(web.base + "/")
        field = browser.find_element(By.ID, "token")
        field.send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#signin-form button").click()
        wait_text(browser, "#view table", "down_low")
        wait_text(browser, "#who", "console (admin, every project)")
        assert "down_low\n1\n1000" in wait_text(browser, "#view table", "down_low").replace(" ", "\n")
        # the charts: pages stored per minute (3 stored by the worker above) and queue depth as sampled
        stored = browser.find_element(
            By.CSS_SELECTOR, '#chart-pages path[data-series="stored"]'
        ).get_attribute("d")
        assert stored.count("L") > 10 and browser.find_element(
            By.CSS_SELECTOR, '#chart-depth path[data-series="down_low"]'
        )
        assert "pages per minute" in browser.find_element(By.ID, "chart-pages").text
        # a depth of 1 is labelled 0, 1, 2: every tick of the y axis distinct
        ticks = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#chart-depth .y-tick")]
        assert ticks == ["0", "1", "2"], ticks
        var = ROOT / "var"
        var.mkdir(exist_ok=True)
        shot = browser.get_screenshot_as_png()
        (var / "console-overview.png").write_bytes(shot)
        assert len(shot) > 10_000 and png_variety(shot) > 50

        click(browser, '//nav/a[@data-view="jobs"]')
        wait_text(browser, "#view table", "site")
        assert "other-team" in wait_text(browser, "#view table", "other-team")  # all projects: both
        # the project switcher: one project's jobs at a time
        from selenium.webdriver.support.ui import Select, WebDriverWait

        pick = Select(browser.find_element(By.ID, "project"))
        assert [o.text for o in pick.options] == ["all projects", "1 default", "2 team-b"]
        pick.select_by_visible_text("2 team-b")
        WebDriverWait(browser, 15).until(lambda d: "site" not in jobs_shown(d))
        assert jobs_shown(browser) == ["other-team"]
        pick.select_by_visible_text("all projects")
        WebDriverWait(browser, 15).until(lambda d: sorted(jobs_shown(d)) == ["other-team", "site"])
        pick.select_by_visible_text("1 default")
        WebDriverWait(browser, 15).until(lambda d: jobs_shown(d) == ["site"])
        click(browser, "//button[text()='Disable']")
        wait_text(browser, "#view td", "OFF")
        assert Job.objects.get(name="site").status == "OFF"

        browser.get(web.base + "/#/job/site")
        wait_text(browser, "#view", "Requeue tasks")
        Select(browser.find_element(By.ID, "filter-t-tasks")).select_by_value("DEAD")  # the DEAD tasks only
        WebDriverWait(browser, 15).until(lambda d: "/page/9" not in d.find_element(By.ID, "t-tasks").text)
        assert "/status/500/dead" in wait_text(browser, "#t-tasks", "/status/500/dead")
        click(browser, "//button[text()='Requeue tasks']")  # FAIL and DEAD are ticked
        wait_text(browser, "#status", "requeued")
        assert statuses("site").get("DEAD", 0) == 0

        click(browser, "//button[text()='Preview']")
        preview = wait_text(browser, "#preview-body", "lorem ipsum")
        assert "<title>page" in preview  # shown as text, never rendered
        (var / "console-job.png").write_bytes(browser.get_screenshot_as_png())

        browser.get(web.base + "/#/exports")
        wait_text(browser, "#export-form", "Request export")
        browser.find_element(By.ID, "export-status").send_keys("200")
        click(browser, "//button[text()='Request export']")
        wait_text(browser, "#status", "export ")
        from common.store.models import Export

        export = Export.objects.get()
        assert export.job_name == "site" and export.format == "xlsx" and export.filter == {"status": [200]}
        wait_text(browser, "#view table", str(export.id))
        # the exports page is not redrawn by the timer: the state arrives over its WebSocket
        from slave.exporter import run_export

        assert run_export(str(export.id), "w1") == "success"
        wait_text(browser, f"#state-{export.id}", "SUCCESS")
        wait_text(browser, "#view table", "Download")
        (var / "console-exports.png").write_bytes(browser.get_screenshot_as_png())

        click(browser, "//button[@id='signout']")
        wait_text(browser, "#signin", "Sign in")
        browser.get(web.base + "/#/jobs")
        wait_text(browser, "#signin", "Sign in")  # the session ended on the server
