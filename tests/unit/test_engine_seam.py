"""The engine seam: every engine registered under the key a job resolves to, its traits the
cluster's one table, the etiquette steps switching themselves off by those traits, and failures
told apart by their class (their text is for people)."""
from __future__ import annotations

import pytest
from bson import ObjectId

from common.engines import DOWNLOADER_TYPES, TRAITS, Traits, engine_key, traits
from common.errors import AddressRefused, DownloadError
from common.jobsettings import ENGINES
from common.metrics import reason_class
from common.store.records import JobSettings
from slave.download.engines import failures
from slave.download.engines.registry import REGISTERED
from slave.download.engines.rules import classify_status, out_of_scope, too_big
from slave.download.job import JobContext
from slave.download.pipeline import CoalescingStep, RobotsStep, SiteSlotStep


def _ctx(language: str = "none", engine: str = "", **conf) -> JobContext:
    return JobContext(job_id=ObjectId(), name="j", status="ON", download_id=None, language=language,
                      code="", engine=engine, max_retry_times=0, settings=JobSettings.from_doc(conf))


def test_every_job_resolves_to_a_registered_engine_whose_traits_are_the_table():
    keys = {engine_key(t, e) for t in DOWNLOADER_TYPES for e in ("", *ENGINES)}
    assert keys == set(TRAITS) == set(REGISTERED)
    for key, cls in REGISTERED.items():
        assert cls.traits is TRAITS[key]
    assert engine_key("none", "") == engine_key("none", "no such engine") == "aiohttp"  # the default
    assert _ctx("python").key == "python" and _ctx(engine="browser").traits.needs_browser


def test_the_traits_say_what_each_engine_is():
    assert [k for k, t in TRAITS.items() if t.builtin] == list(ENGINES)
    assert [k for k, t in TRAITS.items() if t.sandboxed] == ["python", "shell"]
    assert [k for k, t in TRAITS.items() if t.coalesces] == ["aiohttp", "requests"]
    assert not traits("shell").gives_links and traits("python").gives_links
    assert traits("unknown") == Traits()  # a type registration refuses: nothing assumed


@pytest.mark.parametrize("language,engine,robots,coalesces,pooled", [
    ("none", "aiohttp", True, True, True),
    ("none", "requests", True, True, True),
    ("none", "browser", True, False, True),
    ("python", "", False, False, False),
    ("shell", "", False, False, False),
])
def test_each_step_switches_itself_off_by_the_engine_traits(language, engine, robots, coalesces, pooled):
    ctx = _ctx(language, engine)
    assert RobotsStep.applies(ctx) is robots
    assert CoalescingStep.applies(ctx) is coalesces
    assert SiteSlotStep.pooled(ctx) is pooled
    assert RobotsStep.applies(_ctx(language, engine, obey_robots=False)) is False


def test_failures_carry_their_data_and_their_label_not_a_reading_of_their_text():
    busy = classify_status(429, "7")
    assert isinstance(busy, failures.HttpStatus) and busy.code == 429 and busy.pauses_site
    assert busy.reason == "HTTP 429" and busy.retry_after == 7.0 and reason_class(busy) == "http_4xx"
    assert not classify_status(503).pauses_site  # no Retry-After: nothing to pause for
    assert not classify_status(500, "7").pauses_site and reason_class(classify_status(500)) == "http_5xx"
    big = too_big(10)
    assert big.limit == 10 and big.reason == "body larger than 10 bytes" and reason_class(big) == "too_large"
    gone = out_of_scope(lambda url: "another site", "http://b.example/x")
    assert isinstance(gone, failures.OutOfScope) and gone.target == "http://b.example/x"
    assert gone.reason == "redirect out of the job's scope to http://b.example/x: another site"
    # a label no longer follows the words: a timeout named "exit" is a timeout
    assert reason_class(failures.Timeout("exit after 3s")) == "timeout"
    assert reason_class(DownloadError("connection timed out")) == "other"
    assert reason_class(AddressRefused("refused: 127.0.0.1 is a loopback address")) == "connection"
    assert reason_class(None) == ""


def test_a_retyped_failure_keeps_its_class_and_data():
    busy = classify_status(503, "5")
    copy = failures.retyped(busy, "HTTP 503")
    assert type(copy) is failures.HttpStatus and copy.code == 503 and copy.retry_after == 5.0
    assert copy.retryable and str(copy) == copy.reason == "HTTP 503"
