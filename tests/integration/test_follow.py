"""Following links, up to the worker's outcome: [follow] and [sitemaps] checked at registration
(bad input: one line, nothing stored), pages of each built-in engine read for links, and a python
downloader's links capped at the sandbox's boundary. (Storing found links and intake come later.)"""
from __future__ import annotations

import asyncio

import pytest
from bson import ObjectId

from common.jobsettings import Follow
from common.store.models import CrawlerDownload, CrawlerDownloadSetting, CrawlerRegistrationErrorLog, Job
from common.store.records import JobSettings, LeaseTask
from slave.download.fetching import Engines
from slave.worker.context import JobContext
from tests.helpers import cli


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
    # valid, but nothing keeps it yet: refused rather than stored and ignored (invariant 6)
    ('[follow]\nscope = "domain"\n[sitemaps]\nrobots = true\n', "not yet in effect"),
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
        engines = Engines()
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


def test_a_python_downloader_returning_a_million_links_costs_the_caps_only(cluster):
    outcome = _download(_context(language="python", code=MILLION, links_per_page=100),
                        "https://example.org/start")
    assert outcome.error is None, outcome.error
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
