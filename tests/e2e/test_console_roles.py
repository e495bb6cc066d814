"""The console as each role, in headless Chromium (Debian's chromium + chromium-driver, selenium):
a user registers a job from the page (a code error shown beside its line, nothing stored), pastes
1,000 URLs and watches them stored by a worker, requests an xlsx and downloads it; an analyst sees
no control that changes anything; a user of another project sees none of it; every
``data-action`` names an operation of /api/v1/openapi.json and each role sees only the ones it may
call. Screenshots at 1280 px and at a phone's width go to var/."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from common.queue.rqbridge import queue_key
from common.store.models import Export, Job
from master.dispatch.dispatcher import dispatch_once
from tests.e2e.test_console_browser import BIN, CHROMIUM, DRIVER, ROOT, click, wait_text
from tests.helpers import cli, statuses, wait_for
from tests.web_helpers import WebServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver"),
]
VAR = ROOT / "var"
CHANGES = {
    "register_job",
    "enable_job",
    "disable_job",
    "generator_on",
    "generator_off",
    "generator_run",
    "add_job_tasks",
    "cancel_tasks",
    "requeue_tasks",
    "dry_run_job",
    "show_dry_run",
    "create_project",
    "create_token",
    "grant_token",
    "revoke_token",
    "enable_type",
    "disable_type",
    "dispatch",
    "get_audit",
    "list_tokens",
}
MANIFEST = """name = "shop"
priority = 5
type = "python"
code = "shop.py"

[settings]
dispatch_num = 1000
obey_robots = false
allow_private = true
cookie = "sid=team-a"
headers = { "X-Team" = "a" }
"""
BROKEN = "import urllib.request\n\n\ndef download(task)\n    return {}\n"  # line 4: no colon
CODE = """import urllib.request


def download(task):
    with urllib.request.urlopen(task["url"], timeout=10) as resp:
        return {"status_code": resp.status, "headers": dict(resp.headers.items()), "body": resp.read()}
"""


@pytest.fixture
def chrome(tmp_path):
    """A factory of headless Chromium sessions that download into tmp_path/downloads."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # selenium manager must never fetch a driver
    made = []

    def make(width: int = 1280, height: int = 900):
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            f"--window-size={width},{height}",
            "--disable-gpu",
            "--no-first-run",
        ):
            options.add_argument(arg)
        options.add_experimental_option(
            "prefs",
            {
                "download.default_directory": str(tmp_path / "downloads"),
                "download.prompt_for_download": False,
            },
        )
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
        driver.implicitly_wait(0)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.quit()


def sign_in(driver, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base + "/")
    wait_text(driver, "#signin", "Sign in")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#signin-form button").click()
    wait_text(driver, "#who", "(")


def visit(driver, base: str, hash_: str, text: str, css: str = "#view") -> set[str]:
    """Open a page of the console, wait for ``text`` in it; the data-action names of the controls
    it shows (read in one script: the page redraws itself)."""
    driver.get(f"{base}/{hash_}")
    wait_text(driver, css, text)
    return set(
        driver.execute_script(
            "return [...document.querySelectorAll('[data-action]')]"
            ".filter((e) => e.getClientRects().length).map((e) => e.dataset.action)"
        )
    )


def set_value(driver, element_id: str, text: str) -> None:
    """Put ``text`` in a field as a paste does (one input event)."""
    driver.execute_script(
        "const a = document.getElementById(arguments[0]); a.value = arguments[1];"
        "a.dispatchEvent(new Event('input'));",
        element_id,
        text,
    )


def shoot(driver, name: str, width: int, height: int = 0) -> Path:
    """A screenshot at ``width`` px into var/: ``height`` px of the page's top, or all of it."""
    driver.set_window_size(width, height or 900)
    if not height:
        height = driver.execute_script("return Math.max(document.body.scrollHeight, 600)") + 140
    driver.set_window_size(width, min(int(height), 4000))
    VAR.mkdir(exist_ok=True)
    path = VAR / f"console-{name}-{width}.png"
    path.write_bytes(driver.get_screenshot_as_png())
    return path


def run_worker(cluster) -> None:
    done = subprocess.run(
        [str(BIN / "downcluster"), "worker", "--burst", "--no-exports"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **cluster.env},
    )
    assert done.returncode == 0, done.stderr[-2000:]


def worker_until_stored(cluster, name: str, n: int) -> None:
    end = time.monotonic() + 240
    while statuses(name).get("SUCCESS", 0) < n and time.monotonic() < end:
        dispatch_once(cluster.redis)
        run_worker(cluster)
    assert statuses(name) == {"SUCCESS": n}


def tokens() -> dict[str, str]:
    assert cli("project", "create", "team-a", "--allow-private").exit_code == 0  # the local site
    assert cli("project", "create", "team-b").exit_code == 0

    def make(name, role, *project):
        out = cli("token", "create", name, "--role", role, *[a for p in project for a in ("--project", p)])
        assert out.exit_code == 0, out.output
        return out.stdout.strip().splitlines()[-1]

    return {
        "admin": make("root", "admin"),
        "user": make("ana", "user", "team-a"),
        "analyst": make("ines", "analyst", "team-a"),
        "other": make("olaf", "user", "team-b"),
    }


def test_console_as_each_role(cluster, chrome, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    keys = tokens()
    with WebServer(cluster.env) as web:
        spec = requests.get(web.base + "/api/v1/openapi.json", timeout=30).json()
        operations = {
            op["operationId"]
            for path in spec["paths"].values()
            for op in path.values()
            if isinstance(op, dict) and "operationId" in op
        }
        user = chrome()
        sign_in(user, web.base, keys["user"])
        seen = visit(user, web.base, "#/register", "manifest", "#register-form")
        # a code error: shown beside line 4 of the code's editor, nothing stored
        set_value(user, "manifest", MANIFEST)
        set_value(user, "code", BROKEN)
        click(user, "//button[text()='Register']")
        error = wait_text(user, "#code-error", "line 4")
        assert "does not parse" in error and user.find_element(By.ID, "code-error").is_displayed()
        top = (
            user.find_element(By.ID, "code-error").location["y"]
            - user.find_element(By.ID, "code").location["y"]
        )
        assert 40 < top < 100, top  # beside the 4th line, not below the editor
        assert not Job.objects(name="shop")
        shoot(user, "register-error", 1280, 640)
        shoot(user, "register-error", 390, 844)
        user.set_window_size(1280, 900)
        set_value(user, "code", CODE)
        click(user, "//button[text()='Register']")
        wait_text(user, "h1", "Job shop")
        held = requests.get(
            web.base + "/api/v1/projects", headers={"Authorization": f"Bearer {keys['user']}"}, timeout=30
        ).json()["projects"]
        assert [p["name"] for p in held] == ["team-a"]
        assert Job.objects.get(name="shop").project == held[0]["id"]  # the user's one project

        urls = (
            "\n".join(f"{cluster.site}/page/{i}" for i in range(1000))
            + f"\n{cluster.site}/page/1\nftp://no\n"
        )
        set_value(user, "urls", urls)
        click(user, "//button[text()='Add URLs']")
        assert wait_text(user, "#add-summary", "added") == "added 1,000 · duplicate 1 · rejected 1"
        wait_text(user, "#add-report", "line")  # the rejected line and its reason
        worker_until_stored(cluster, "shop", 1000)
        wait_text(user, "#job-counts", "SUCCESS 1,000", timeout=20)  # the page updates by itself
        seen |= visit(user, web.base, "#/job/shop", "SUCCESS 1,000")
        # a dry run on one URL: a worker answers, the page shows status, headers and body; nothing stored
        set_value(user, "dry-url", f"{cluster.site}/page/3")
        click(user, "//button[text()='Dry run']")
        wait_for(lambda: cluster.redis.llen(queue_key("down_super")) > 0, 30, "the dry run's entry")
        run_worker(cluster)
        assert wait_text(user, "#dry-summary", "HTTP 200", timeout=30).startswith("HTTP 200")
        assert "page 3" in user.find_element(By.ID, "dry-body").text
        assert statuses("shop") == {"SUCCESS": 1000}
        shoot(user, "dry-run", 1280, 1400)
        shoot(user, "job", 1280, 1100)
        shoot(user, "job", 390, 844)
        user.set_window_size(1280, 900)
        task = user.execute_script(
            "return document.querySelector('#t-tasks td a').hash"
        )  # one read: no stale node
        seen |= visit(user, web.base, task, "Attempts (1)")
        facts = wait_text(user, "#task-facts", "depth")
        assert "SUCCESS" in facts and "0" in facts and "found on" in facts and "[object" not in facts
        shoot(user, "task", 1280)
        # change its settings and code: the manifest comes back rebuilt from the job's page
        seen |= visit(user, web.base, "#/edit/shop", "Change job shop")
        WebDriverWait(user, 15).until(
            lambda d: "dispatch_num = 1000" in d.find_element(By.ID, "manifest").get_attribute("value")
        )
        manifest = user.find_element(By.ID, "manifest").get_attribute("value")
        assert 'cookie = "sid=team-a"' in manifest and '"X-Team" = "a"' in manifest, manifest  # handed back
        shoot(user, "edit", 1280, 900)
        set_value(user, "manifest", manifest.replace("priority = 5", "priority = 7"))
        click(user, "//button[text()='Save changes']")  # out of range: the error beside its key's line
        assert "priority must be" in wait_text(user, "#manifest-error", "line 2")
        set_value(user, "manifest", manifest.replace("priority = 5", "priority = 3"))
        set_value(user, "code", CODE)
        click(user, "//button[text()='Save changes']")
        wait_text(user, "#view p", "priority 3")
        assert Job.objects.get(name="shop").priority == 3

        seen |= visit(user, web.base, "#/exports/shop", "Request export", "#export-form")
        click(user, "//button[text()='Request export']")
        wait_text(user, "#status", "export ")
        export = Export.objects.get()
        assert export.job_name == "shop" and export.format == "xlsx" and export.requested_by == "ana"
        from slave.exporter import run_export

        assert run_export(str(export.id), "w1") == "success"
        wait_text(user, f"#state-{export.id}", "SUCCESS")  # over the WebSocket
        click(user, "//button[text()='Download']")
        target = tmp_path / "downloads"
        WebDriverWait(user, 30).until(
            lambda _: [p for p in target.glob("*.xlsx")] if target.exists() else None
        )
        xlsx = next(target.glob("*.xlsx")).read_bytes()
        assert xlsx[:2] == b"PK" and len(xlsx) > 10_000
        shoot(user, "exports", 1280)

        seen |= visit(user, web.base, "#/center", "Request download task")
        user.find_element(By.ID, "center-name").send_keys("orders today")
        set_value(
            user, "center-rows", '[{"order_no": "A1", "amount": 12.5}, {"order_no": "A2", "amount": 3}]'
        )
        set_value(user, "center-template", '{"order_no": "Order", "amount": "Amount"}')
        click(user, "//button[text()='Request download task']")
        wait_text(user, "#status", "download task ")
        task_export = Export.objects.get(id__ne=export.id)
        assert run_export(str(task_export.id), "w1") == "success"
        wait_text(user, f"#state-{task_export.id}", "SUCCESS")
        wait_text(user, "#t-center", "orders today")
        shoot(user, "center", 1280)
        shoot(user, "center", 390)
        assert seen <= operations, seen - operations
        assert {
            "register_job",
            "add_job_tasks",
            "cancel_tasks",
            "requeue_tasks",
            "disable_job",
            "request_export",
            "deliver_center_task",
            "list_tasks",
            "find_task",
            "get_body",
            "dry_run_job",
        } <= seen, seen
        assert not seen & {"create_project", "create_token", "revoke_token", "get_audit", "dispatch"}

        analyst = chrome()
        sign_in(analyst, web.base, keys["analyst"])
        looked = visit(analyst, web.base, "#/jobs", "shop")
        looked |= visit(analyst, web.base, "#/job/shop", "SUCCESS 1,000")
        shoot(analyst, "job-analyst", 1280, 900)
        looked |= visit(analyst, web.base, "#/center", "orders today")
        looked |= visit(analyst, web.base, "#/exports", "Request an export")
        assert looked <= operations and not looked & CHANGES, looked & CHANGES
        assert (
            not analyst.find_elements(By.ID, "nav-admin")
            or not analyst.find_element(By.ID, "nav-admin").is_displayed()
        )
        # not this export's requester: no cancel, retry or delete either
        assert not looked & {"cancel_export", "retry_export", "delete_center_tasks"}

        other = chrome()
        sign_in(other, web.base, keys["other"])
        visit(other, web.base, "#/jobs", "no jobs registered")
        visit(other, web.base, "#/job/shop", "no job named 'shop'", "#view-error")
        visit(other, web.base, "#/center", "no download tasks")
        visit(other, web.base, "#/exports", "no exports yet")
        assert "shop" not in other.find_element(By.ID, "view").text

        admin = chrome()
        sign_in(admin, web.base, keys["admin"])
        every = visit(admin, web.base, "#/admin", "Audit log")
        assert {"create_project", "create_token", "revoke_token", "grant_token", "get_audit"} <= every
        admin.find_element(By.ID, "project-name").send_keys("team-c")
        admin.find_element(By.ID, "project-private").click()
        click(admin, "//button[text()='Create project']")
        wait_text(admin, "#t-projects", "team-c")
        admin.find_element(By.ID, "token-name").send_keys("carl")
        click(admin, "//button[text()='Create token']")
        secret = wait_text(admin, "#token-value", "dct_")
        assert (
            requests.get(
                web.base + "/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"}, timeout=30
            ).status_code
            == 200
        )
        wait_text(admin, "#t-audit", "token.create")
        shoot(admin, "admin", 1280)
        shoot(admin, "admin", 390)
        admin.set_window_size(1280, 900)
        every |= visit(admin, web.base, "#/job/shop", "SUCCESS 1,000")
        every |= visit(admin, web.base, "#/overview", "Queues")
        assert every <= operations, every - operations
        shoot(admin, "overview", 1280)
