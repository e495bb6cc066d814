"""Jobs seeded from sitemaps end to end: registration makes the sitemaps tasks, real `downcluster
worker` processes fetch them (as any page: robots.txt, site slots, the wall) and read them, and
their entries come back as tasks, round after round until nothing is left, against a site
started here: a sitemap index naming a plain and a gzipped sitemap, a robots.txt with Sitemap:
lines, a malformed sitemap, an XML bomb and a sitemap naming another site."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.store.clock import store_now
from common.store.models import CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, burst_worker, cli, wait_for, write_job
from tests.web_helpers import WebServer

pytestmark = pytest.mark.slow
URLSET = ('<?xml version="1.0" encoding="UTF-8"?>'
          '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{}</urlset>')
BOMB = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        '<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]><urlset>&lol2;</urlset>')


LASTMOD = {"now": "2024-05-17"}  # /lastmod.xml's lastmod of /lm/1 (that of /lm/2 stays)


def urlset(*urls: str, lastmod: str = "2024-05-17") -> str:
    return URLSET.format("".join(f"<url><loc>{u}</loc><lastmod>{lastmod}</lastmod></url>" for u in urls))


class Site(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, data: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        port = self.server.server_address[1]
        me = f"http://127.0.0.1:{port}"
        xml = {
            "/index.xml": '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                          f'<sitemap><loc>{me}/a.xml</loc></sitemap>'
                          '<sitemap><loc>/b.xml.gz</loc></sitemap></sitemapindex>',
            "/a.xml": urlset(f"{me}/a/1", f"{me}/a/2"),
            "/robots-listed.xml": urlset(f"{me}/r/1"),
            "/bad.xml": "<urlset><url><loc>/never</loc></url>",
            "/bomb.xml": BOMB,
            "/other-site.xml": urlset(f"http://localhost:{port}/elsewhere", f"{me}/here"),
            "/lastmod.xml": urlset(f"{me}/lm/1", lastmod=LASTMOD["now"])[:-len("</urlset>")]
                            + f"<url><loc>{me}/lm/2</loc><lastmod>2024-05-17</lastmod></url></urlset>",
        }
        if self.path == "/b.xml.gz":
            self._send(gzip.compress(urlset(f"{me}/b/1", "/b/2").encode()), "application/gzip")
        elif self.path == "/robots.txt":
            self._send(b"User-agent: *\nAllow: /\nSitemap: /robots-listed.xml\n", "text/plain")
        elif self.path in xml:
            self._send(xml[self.path].encode(), "application/xml")
        else:
            self._send(b"<html><body><a href='/linked'>a link</a></body></html>", "text/html")


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def register(tmp_path, name: str, tables: str, **settings) -> Job:
    manifest = write_job(tmp_path, name, **settings)
    manifest.write_text(manifest.read_text() + tables)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 0, result.output
    return Job.objects.get(name=name)


def crawl(cluster, name: str) -> tuple[dict[str, dict], str]:
    """Dispatcher and worker rounds until the job has nothing left to do: its tasks by URL, and
    what the workers logged."""
    job, logged = Job.objects.get(name=name), ""
    for _ in range(50):
        if not CrawlerTask.objects(job=job, status__in=["LIVE", "DISPATCH"]).count():
            break
        wait_for(lambda: dispatch_once(cluster.redis).total, what="tasks to send")
        done = subprocess.run([str(Path(sys.executable).parent / "downcluster"), "worker", "--burst"],
                              capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env})
        assert done.returncode == 0, done.stderr[-2000:]
        logged += done.stdout + done.stderr
    else:
        raise AssertionError("the crawl did not end")
    return {d["uri"]: d for d in CrawlerTask._get_collection().find({"job": job.id})}, logged


def test_an_index_with_a_gzipped_child_seeds_exactly_its_urls(cluster, tmp_path, site):
    register(tmp_path, "mapped", f'[sitemaps]\nurls = ["{site}/index.xml"]\n')
    tasks, _ = crawl(cluster, "mapped")
    pages = [f"{site}/{p}" for p in ("a/1", "a/2", "b/1", "b/2")]
    maps = [f"{site}/{p}" for p in ("index.xml", "a.xml", "b.xml.gz")]
    assert sorted(tasks) == sorted(pages + maps)  # no follow: the pages' links are not tasks
    assert all(t["status"] == "SUCCESS" for t in tasks.values())
    index, a, b = (tasks[u] for u in maps)
    assert (index["sitemap"], index["depth"], index.get("parent")) == ("xml", 0, None)
    assert {(t["sitemap"], t["depth"], t["parent"]) for t in (a, b)} == {("xml", 1, index["_id"])}
    for url in pages:
        assert "sitemap" not in tasks[url] and tasks[url]["depth"] == 0
        assert tasks[url]["parent"] == (a if "/a/" in url else b)["_id"]
    # task show and the API's task view: a sitemap's kind, depth and parent; a page has no kind
    shown = cli("task", "show", "mapped", f"{site}/b.xml.gz").output
    assert "sitemap: xml\n" in shown and "depth: 1\n" in shown and f"parent: {index['_id']}\n" in shown
    assert "sitemap: -\n" in cli("task", "show", "mapped", f"{site}/b/2").output
    token = cli("token", "create", "an", "--role", "analyst", "--project", "default")
    bearer = token.output.strip().splitlines()[-1]
    with WebServer(cluster.env) as web:
        views = {u: web.call("GET", f"/api/v1/tasks/{tasks[u]['_id']}", bearer).json()
                 for u in (maps[2], pages[3])}
        found = web.call("GET", "/api/v1/jobs/mapped/tasks/lookup", bearer, params={"url": maps[0]}).json()
    assert {k: views[maps[2]][k] for k in ("sitemap", "depth", "parent")} == {
        "sitemap": "xml", "depth": 1, "parent": str(index["_id"])}
    assert {k: views[pages[3]][k] for k in ("sitemap", "depth", "parent")} == {
        "sitemap": None, "depth": 0, "parent": str(b["_id"])}
    assert (found["sitemap"], found["depth"], found["parent"]) == ("xml", 0, None)


def test_robots_sitemap_lines_seed_too(cluster, tmp_path, site):
    register(tmp_path, "robots", "[sitemaps]\nrobots = true\n")
    add_urls("robots", [site + "/seed"])
    tasks, _ = crawl(cluster, "robots")
    assert sorted(tasks) == sorted(f"{site}/{p}" for p in ("seed", "robots.txt", "robots-listed.xml", "r/1"))
    assert tasks[site + "/robots.txt"]["sitemap"] == "robots"
    assert "sitemap: robots\n" in cli("task", "show", "robots", site + "/robots.txt").output
    assert tasks[site + "/robots-listed.xml"]["parent"] == tasks[site + "/robots.txt"]["_id"]


def test_a_malformed_sitemap_and_a_bomb_are_logged_and_the_worker_goes_on(cluster, tmp_path, site):
    urls = ", ".join(f'"{site}/{p}"' for p in ("bad.xml", "bomb.xml", "a.xml"))
    register(tmp_path, "broken", f"[sitemaps]\nurls = [{urls}]\n")
    tasks, logged = crawl(cluster, "broken")
    assert sorted(tasks) == sorted(f"{site}/{p}" for p in ("bad.xml", "bomb.xml", "a.xml", "a/1", "a/2"))
    assert all(t["status"] == "SUCCESS" for t in tasks.values())
    assert f"sitemap {site}/bad.xml not read: sitemap is not well-formed XML" in logged
    assert f"sitemap {site}/bomb.xml not read: sitemap has a document type declaration" in logged


def test_a_following_job_takes_no_sitemap_entry_out_of_its_scope(cluster, tmp_path, site):
    register(tmp_path, "scoped", f'[follow]\nmax_depth = 0\n[sitemaps]\nurls = ["{site}/other-site.xml"]\n')
    tasks, _ = crawl(cluster, "scoped")
    # localhost is another site than 127.0.0.1; max_depth 0 follows no link of the pages
    assert sorted(tasks) == sorted(f"{site}/{p}" for p in ("other-site.xml", "here"))


def test_a_newer_lastmod_makes_its_page_due(cluster, tmp_path, site):
    job = register(tmp_path, "lastmod", f'[sitemaps]\nurls = ["{site}/lastmod.xml"]\nlastmod = true\n',
                   revisit=86400)
    tasks, _ = crawl(cluster, "lastmod")
    assert sorted(tasks) == sorted(f"{site}/{p}" for p in ("lastmod.xml", "lm/1", "lm/2"))
    # /lm/1 changes after its visit; the sitemap says so when it is read again (made due here)
    LASTMOD["now"] = (store_now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    CrawlerTask.objects(job=job, uri=site + "/lastmod.xml").update(set__retry_at=store_now())

    def visits(path: str) -> int:
        return CrawlerTask.objects.get(job=job, uri=site + path).visits or 0

    wait_for(lambda: visits("/lm/1") == 2 or (dispatch_once(cluster.redis).total and burst_worker(cluster)),
             what="the page of a newer lastmod revisited")
    assert visits("/lastmod.xml") == 2 and visits("/lm/2") == 1  # its lastmod is older than its visit
