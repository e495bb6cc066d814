"""Following links: [follow] and [sitemaps] checked at registration (bad input: one line, nothing
stored), [follow] stored with the job and read by its workers, pages of each built-in engine read
for links, a python downloader's links capped at the sandbox's boundary, and the links of stored
pages added by intake in scope and within the caps, behind the fence (a lost lease adds nothing).
Whole crawls are in tests/e2e/test_crawl.py."""
from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote, urlsplit

import pytest
from bson import ObjectId

import sample_site
from common.intake import add_found
from common.jobsettings import Follow, Sitemaps
from common.store import counts, leases
from common.store.clock import utcnow
from common.store.log_models import CrawlerRegistrationErrorLog
from common.store.models import FRESH, CrawlerDownload, CrawlerDownloadSetting, CrawlerLease, CrawlerTask, Job
from common.store.records import JobSettings, Lease, LeaseTask
from master.dispatch import defender
from master.dispatch.dispatcher import dispatch_once
from slave.download.engines.base import Download
from slave.download.fetching import Fetcher
from slave.download.job import JobContext
from slave.download.links import Found
from slave.worker import context, writer
from tests.helpers import add_urls, cli, store_outcomes, write_job
from tests.integration.test_races import _stale


def _nothing_stored() -> bool:
    return Job.objects.count() == 0 and CrawlerDownload.objects.count() == 0 \
        and CrawlerDownloadSetting.objects.count() == 0


@pytest.mark.parametrize("tables,why", [
    ('[follow]\nallow = ["(unclosed"]\n', "follow.allow pattern '(unclosed' does not compile"),
    ('[follow]\nmax_depth = -1\n', "follow.max_depth must be an integer in 0..10000, got -1"),
    ('[follow]\ncontent_types = ["application/pdf"]\n', "'application/pdf' is not parsed for links"),
    ('[follow]\nscope = "internet"\n', "follow.scope must be one of"),
    ('[sitemaps]\nurls = ["file:///etc/passwd"]\n', "scheme must be http or https"),
    ('[sitemaps]\nrobots = true\nlastmod = true\n', "needs settings.revisit"),
])
def test_follow_and_sitemaps_checked_at_registration(cluster, tmp_path, tables, why):
    manifest = tmp_path / "job.toml"
    manifest.write_text('name = "crawl"\ntype = "none"\n' + tables)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 2
    assert why in result.output and len(result.output.strip().splitlines()) == 1
    assert _nothing_stored()
    assert CrawlerRegistrationErrorLog.objects.count() == 1
    assert why in CrawlerRegistrationErrorLog.objects.first().reason


def _context(language: str = "none", engine: str = "aiohttp", code: str = "", **follow) -> JobContext:
    return JobContext(job_id=ObjectId(), name="crawl", status="ON", download_id=None, language=language,
                      code=code, engine=engine, max_retry_times=0,
                      settings=JobSettings.from_doc({"allow_private": True, "obey_robots": False,
                                                     "download_engine": engine}),
                      follow=Follow(**follow))


def _download(ctx: JobContext, url: str):
    async def run():
        engines = Fetcher()
        try:
            return await engines.download(ctx, LeaseTask(ObjectId(), url))
        finally:
            await engines.close()
    return asyncio.run(run())


@pytest.mark.parametrize("engine", ["aiohttp", "requests", "browser"])
def test_each_engine_pages_links_on_the_outcome(cluster, engine):
    outcome = _download(_context(engine=engine), cluster.site + "/links/3")
    assert outcome.error is None and outcome.download.status_code == 200
    assert outcome.links.urls == [cluster.site + f"/links/{n}" for n in (4, 7, 8)]  # rel=next, then <a>s
    assert outcome.links.skipped == 2 and outcome.links.excess == 0  # mailto:, javascript:


@pytest.mark.parametrize("engine", ["aiohttp", "requests", "browser"])
def test_a_redirect_out_of_scope_is_not_followed_and_fails_the_page(cluster, engine, caplog):
    """A following job's page redirected off its site (or to a denied URL) is a final failure
    that names where and why, its target never requested (nothing stored); a redirect within
    scope is followed, and a job that does not follow follows any."""
    key = f"offsite-{uuid.uuid4().hex[:8]}"
    sample_site.VERSIONED[key] = [1, "none"]
    off = f"http://localhost:{urlsplit(cluster.site).port}/versioned/{key}"  # another site, the same server
    with caplog.at_level("INFO", logger="slave.download.fetching"):
        outcome = _download(_context(engine=engine), f"{cluster.site}/redirect-to?url={quote(off, safe='')}")
    assert outcome.download is None and not outcome.error.retryable
    assert outcome.error.reason == f"redirect out of the job's scope to {off}: another site than 127.0.0.1"
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "scope" in r.getMessage()] == [
        f"{outcome.error.reason}, not followed"]  # logged once, with the job and task
    denied = _download(_context(engine=engine, deny=("/versioned/",)), f"{cluster.site}/redirect-to?url="
                       + quote(f"{cluster.site}/versioned/{key}", safe=""))
    assert denied.error.reason.endswith(": matches deny pattern '/versioned/'")
    assert key not in sample_site.ANSWERS  # neither target was requested
    inside = _download(_context(engine=engine), f"{cluster.site}/redirect-to?url=/links/3")
    assert inside.error is None and inside.links.urls == [cluster.site + f"/links/{n}" for n in (4, 7, 8)]
    ctx = _context(engine=engine)
    ctx.follow = None
    assert _download(ctx, f"{cluster.site}/redirect-to?url={quote(off, safe='')}").error is None
    assert sample_site.ANSWERS[key] == [200]


def test_a_page_of_a_job_that_does_not_follow_is_not_parsed(cluster):
    ctx = _context()
    ctx.follow = None
    assert _download(ctx, cluster.site + "/links/3").links is None


def test_content_types_the_job_does_not_parse_bring_no_links(cluster):
    assert _download(_context(), cluster.site + "/page/1").links.urls == []  # html, no links
    assert _download(_context(), cluster.site + "/bytes/100").links is None  # not html


def test_the_cap_on_links_per_page_is_counted(cluster):
    outcome = _download(_context(links_per_page=1), cluster.site + "/links/3")
    # past the cap links are counted unread: 7, 8, #x, mailto: and javascript:
    assert outcome.links.urls == [cluster.site + "/links/4"] and outcome.links.excess == 5


MILLION = """
def download(task):
    links = ["https://example.org/page/%d#frag" % i for i in range(1_000_000)]
    links[0:0] = ["/relative", "mailto:x@y.z", 7, "https://example.org/" + "x" * 5000]
    return {"status_code": 200, "headers": {"Content-Type": "text/html"}, "body": "<a href=/ignored>",
            "links": links}
"""


def test_a_python_downloader_returning_a_million_links_costs_the_caps_only(cluster, caplog):
    with caplog.at_level("INFO", logger="slave.download.fetching"):
        outcome = _download(_context(language="python", code=MILLION, links_per_page=100),
                            "https://example.org/start")
    assert outcome.error is None, outcome.error
    logged = [r.getMessage() for r in caplog.records if "over the cap" in r.getMessage()]
    assert len(logged) == 1 and logged[0].endswith(": 100 links taken, 999903 over the cap")  # once
    found = outcome.links
    assert found.urls[:3] == ["https://example.org/relative", "https://example.org/page/0",
                              "https://example.org/page/1"]
    assert len(found.urls) == 100 and found.skipped == 1  # mailto:
    assert found.excess == 1_000_004 - 100 - 1  # the sandbox's drops (a number, an over-long URL) included


@pytest.mark.parametrize("links,why", [
    ("'not a list'", "links must be a list of URLs"),
    ("{'a': 1}", "links must be a list of URLs"),
])
def test_a_python_downloaders_malformed_links_fail_its_download(cluster, links, why):
    code = f"def download(task):\n    return {{'status_code': 200, 'body': 'x', 'links': {links}}}\n"
    outcome = _download(_context(language="python", code=code), "https://example.org/start")
    assert outcome.download is None and why in outcome.error.reason


def test_a_python_downloaders_page_is_not_parsed_only_its_links_taken(cluster):
    code = ("def download(task):\n    return {'status_code': 200, 'headers': {'Content-Type': 'text/html'},"
            " 'body': '<a href=/in-the-body>'}\n")
    outcome = _download(_context(language="python", code=code), "https://example.org/start")
    assert outcome.error is None and outcome.links is None


# --- [follow] stored, found links added -----------------------------------------------------

def _following(tmp_path, name: str, follow: str = "") -> Job:
    manifest = write_job(tmp_path, name)
    manifest.write_text(manifest.read_text() + "[follow]\n" + follow)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 0, result.output
    return Job.objects.get(name=name)


def test_follow_is_stored_with_the_job_and_read_by_its_workers(cluster, tmp_path):
    job = _following(tmp_path, "crawl", 'scope = "domain"\ndeny = ["/calendar/"]\nmax_depth = 2\n')
    ctx = context.load_context(job.id)
    assert ctx.follow == Follow(scope="domain", deny=("/calendar/",), max_depth=2)
    shown = cli("job", "show", "crawl").output
    assert "follow: scope domain, max_depth 2, max_pages 10000, links_per_page 1000, 0 allow and 1 deny" \
        in shown
    manifest = write_job(tmp_path, "crawl")  # registered again without [follow]: it follows nothing
    assert cli("job", "register", str(manifest)).exit_code == 0
    assert Job._get_collection().find_one({"_id": job.id}).get("follow") is None
    context._contexts.clear()
    assert context.load_context(job.id).follow is None


def test_sitemaps_are_stored_with_the_job_and_its_sitemaps_become_tasks(cluster, tmp_path):
    manifest = write_job(tmp_path, "mapped", revisit=3600)
    manifest.write_text(manifest.read_text() + '[sitemaps]\nurls = ["https://a.org/s.xml", "https://a.org/s.xml"]\n'
                        'robots = true\nlastmod = true\n')
    assert cli("job", "register", str(manifest)).exit_code == 0, "registered"
    job = Job.objects.get(name="mapped")
    assert "sitemaps: 1 urls, robots.txt yes, lastmod feeds revisits\n" in cli("job", "show", "mapped").output
    assert context.load_context(job.id).sitemaps == Sitemaps(urls=("https://a.org/s.xml",), robots=True,
                                                             lastmod=True)
    add_urls("mapped", ["https://b.org/x", "https://b.org/y"])  # robots = true: one robots.txt a site
    kinds = {t.uri: (t.sitemap, t.depth) for t in CrawlerTask.objects(job=job)}
    assert kinds == {"https://a.org/s.xml": ("xml", 0), "https://b.org/robots.txt": ("robots", 0),
                     "https://b.org/x": (None, None), "https://b.org/y": (None, None)}
    assert cli("job", "register", str(manifest)).exit_code == 0  # again: its sitemap task is kept as it is
    assert CrawlerTask.objects(job=job).count() == 4


def _claimed(cluster, name: str, seeds: list[str]) -> tuple[Lease, JobContext, list[writer.Outcome]]:
    add_urls(name, seeds)
    dispatch_once(cluster.redis)
    lease = leases.claim(CrawlerLease._get_collection().find_one({"state": "QUEUED"})["_id"], "w1")
    ctx = context.load_context(lease.job)
    return lease, ctx, [writer.Outcome(task=t, download=Download(200, {}, b"<html>", t.uri), error=None,
                                       spend_us=5) for t in leases.lease_tasks(lease)]


def _tasks(name: str) -> dict[str, dict]:
    job = Job.objects.get(name=name)
    return {d["uri"]: d for d in CrawlerTask._get_collection().find({"job": job.id})}


def test_links_of_a_stored_page_become_tasks_with_depth_and_parent(cluster, tmp_path):
    _following(tmp_path, "crawl", 'deny = ["/private/"]\nmax_depth = 2\n')
    seed = "http://a.test/start"
    lease, ctx, (outcome,) = _claimed(cluster, "crawl", [seed])
    outcome.links = Found(urls=["http://a.test/one", "http://a.test/private/x", "http://b.test/other",
                                "https://a.test:8443/two", seed])
    assert store_outcomes(ctx, lease.id, FRESH, [outcome], utcnow())["success"] == 1
    tasks = _tasks("crawl")
    assert sorted(tasks) == ["http://a.test/one", seed, "https://a.test:8443/two"]  # the seed is known
    seed_id = tasks[seed]["_id"]
    for url in ("http://a.test/one", "https://a.test:8443/two"):
        assert tasks[url]["depth"] == 1 and tasks[url]["parent"] == seed_id and tasks[url]["status"] == "LIVE"
    assert counts.of_jobs([tasks[seed]["job"]])[tasks[seed]["job"]]["LIVE"] == 2
    shown = cli("task", "show", "crawl", "http://a.test/one").output
    assert "depth: 1\n" in shown and f"parent: {seed_id}\n" in shown
    assert "depth: 0\n" in cli("task", "show", "crawl", seed).output


def test_a_found_pages_depth_travels_in_its_lease_and_its_links_go_one_deeper(cluster, tmp_path, monkeypatch):
    """Issue 54: the entry of found pages carries their depths (the writer reads no task for
    them); the seeds' entry carries none (read from the tasks, as a lease written before)."""
    import common.intake

    _following(tmp_path, "crawl", "max_depth = 3\n")
    lease, ctx, (outcome,) = _claimed(cluster, "crawl", ["http://a.test/0"])
    assert lease.depths is None and outcome.task.depth is None
    outcome.links = Found(urls=["http://a.test/1"])
    store_outcomes(ctx, lease.id, FRESH, [outcome], utcnow())
    dispatch_once(cluster.redis)
    found = leases.claim(CrawlerLease._get_collection().find_one({"state": "QUEUED"})["_id"], "w1")
    assert found.depths == [1] and leases.lease_tasks(found)[0].depth == 1
    read: list = []
    monkeypatch.setattr(common.intake, "depths", lambda ids: read.append(ids) or {})
    one = writer.Outcome(task=leases.lease_tasks(found)[0], error=None, spend_us=5,
                         download=Download(200, {}, b"<html>", "http://a.test/1"))
    one.links = Found(urls=["http://a.test/2"])
    assert store_outcomes(ctx, found.id, FRESH, [one], utcnow())["success"] == 1
    assert read == [] and _tasks("crawl")["http://a.test/2"]["depth"] == 2


def test_depth_and_pages_caps_hold_in_intake(cluster, tmp_path):
    job = _following(tmp_path, "crawl", "max_depth = 2\nmax_pages = 4\n")
    add_urls("crawl", ["http://a.test/0"])
    seed = _tasks("crawl")["http://a.test/0"]["_id"]
    report = add_found(job.id, context.load_context(job.id).follow,
                       [(seed, "http://a.test/0", [f"http://a.test/1/{i}" for i in range(10)])])
    assert (report.added, report.refused) == (3, 7)  # the seed and 3 found: max_pages 4
    one = _tasks("crawl")["http://a.test/1/0"]["_id"]
    Job._get_collection().update_one({"_id": job.id}, {"$set": {"follow.max_pages": 100}})
    context._contexts.clear()
    follow = context.load_context(job.id).follow
    report = add_found(job.id, follow, [(one, "http://a.test/1/0", ["http://a.test/2/0", "http://a.test/1/1"])])
    assert (report.added, report.duplicate) == (1, 1) and _tasks("crawl")["http://a.test/2/0"]["depth"] == 2
    two = _tasks("crawl")["http://a.test/2/0"]["_id"]
    report = add_found(job.id, follow, [(two, "http://a.test/2/0", ["http://a.test/3/0"])])
    assert report.added == 0 and report.refused == 1  # deeper than max_depth 2
    assert len(_tasks("crawl")) == 5


def test_a_link_too_deep_on_one_page_is_taken_from_a_shallower_page_of_the_same_write(cluster, tmp_path):
    """Issue 54: one write's pages at depths 2 (its links too deep) and 1 both link to a URL:
    it is added at depth 2, found on the shallower page (it was refused for good when the deep
    page came first: seen once, judged once)."""
    job = _following(tmp_path, "crawl", "max_depth = 2\n")
    add_urls("crawl", ["http://a.test/0"])
    seed = _tasks("crawl")["http://a.test/0"]["_id"]
    follow = context.load_context(job.id).follow
    add_found(job.id, follow, [(seed, "http://a.test/0", ["http://a.test/1", "http://a.test/2"])])
    one, two = (_tasks("crawl")[f"http://a.test/{n}"]["_id"] for n in (1, 2))
    add_found(job.id, follow, [(one, "http://a.test/1", ["http://a.test/3"])])
    deep = _tasks("crawl")["http://a.test/3"]["_id"]  # depth 2: its links would be 3 deep
    report = add_found(job.id, follow, [(deep, "http://a.test/3", ["http://a.test/4"]),
                                        (two, "http://a.test/2", ["http://a.test/4"])])
    assert (report.added, report.refused) == (1, 1)
    found = _tasks("crawl")["http://a.test/4"]
    assert (found["depth"], found["parent"]) == (2, two)


def test_a_lost_leases_page_adds_no_links(cluster, tmp_path):
    _following(tmp_path, "crawl")
    lease, ctx, outcomes = _claimed(cluster, "crawl", ["http://a.test/0", "http://a.test/1"])
    for n, o in enumerate(outcomes):
        o.links = Found(urls=[f"http://a.test/found/{n}"])
    _stale(lease.id)
    assert defender.recover(cluster.redis).recovered == 2  # the worker has lost its lease
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 0
    assert sorted(_tasks("crawl")) == ["http://a.test/0", "http://a.test/1"]
