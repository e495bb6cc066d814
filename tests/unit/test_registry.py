"""A job's manifest, settings and python downloader checked before it is registered (never run)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from common.errors import ValidationError
from common.jobsettings import Follow, Sitemaps
from master.registry import check_python, validate_manifest, validate_settings


@pytest.mark.parametrize(
    "code,why",
    [
        ("def download(:\n", "does not parse"),
        ("x = 1\n", "no top-level"),
        ("def download():\n  pass\n", "argument"),
        ("class A:\n  def download(self, t): pass\n", "no top-level"),
    ],
)
def test_python_code_checked_without_running(code, why):
    with pytest.raises(ValidationError, match=why):
        check_python(code)
    check_python("import os\nos._exit(1)\ndef download(task):\n    return {}\n")  # parsed, never run


@pytest.mark.parametrize(
    "settings_,why",
    [
        ({"dispatch_num": 0}, "dispatch_num"),
        ({"dispatch_num": "10"}, "dispatch_num"),
        ({"max_retry_times": -1}, "max_retry_times"),
        ({"proxy": "not a url"}, "proxy"),
        ({"proxy": "ftp://h:1"}, "proxy"),
        ({"prior": 3}, "prior"),
        ({"download_engine": "curl"}, "download_engine"),
        ({"report_mails": "nobody"}, "report_mails"),
        ({"bogus": 1}, "unknown"),
        ({"cookie": "a\nb"}, "cookie"),
        ({"headers": {"X": 1}}, "headers"),
    ],
)
def test_bad_settings_rejected(settings_, why):
    with pytest.raises(ValidationError, match=why):
        validate_settings(settings_)


def test_manifest_validation(tmp_path: Path):
    (tmp_path / "d.py").write_text("def download(task):\n    return {}\n")
    (tmp_path / "empty.sh").write_text("  \n")
    spec = validate_manifest({"name": "n", "priority": -1, "type": "python", "code": "d.py",
                              "settings": {"proxy": "http://u:p@proxy:3128"}}, tmp_path)
    assert spec.priority == -1 and "download" in spec.code
    for data, why in [
        ({"name": "bad name!"}, "name"),
        ({"name": "n", "priority": True}, "priority"),
        ({"name": "n", "type": "java"}, "type"),
        ({"name": "n", "type": "shell", "code": "empty.sh"}, "empty"),
        ({"name": "n", "type": "python", "code": "missing.py"}, "cannot read"),
        ({"name": "n", "type": "python"}, "needs code"),
        ({"name": "n", "extra": 1}, "unknown"),
    ]:
        with pytest.raises(ValidationError, match=why):
            validate_manifest(data, tmp_path)


def test_follow_and_sitemaps_tables_validated_into_typed_sections():
    spec = validate_manifest({"name": "n", "settings": {"revisit": 3600}, "follow": {
        "scope": "sites", "sites": ["Example.ORG", "bücher.de"], "allow": [r"/news/\d+"], "deny": ["logout"],
        "max_depth": 0, "max_pages": 5, "content_types": ["text/html", "text/html"], "links_per_page": 10_000,
    }, "sitemaps": {"urls": ["https://example.org/sitemap.xml"], "robots": True, "lastmod": True}}, None)
    assert spec.follow == Follow(scope="sites", sites=("example.org", "xn--bcher-kva.de"),
                                 allow=(r"/news/\d+",), deny=("logout",), max_depth=0, max_pages=5,
                                 content_types=("text/html",), links_per_page=10_000)
    assert spec.sitemaps == Sitemaps(urls=("https://example.org/sitemap.xml",), robots=True, lastmod=True)
    plain = validate_manifest({"name": "n", "follow": {}}, None)
    assert plain.follow == Follow() and plain.sitemaps is None
    assert validate_manifest({"name": "n"}, None).follow is None


@pytest.mark.parametrize("extra,why", [
    ({"follow": []}, "follow must be a table"),
    ({"follow": {"scope": "world"}}, "follow.scope must be one of site, domain, sites"),
    ({"follow": {"scope": "sites"}}, "follow.sites is needed"),
    ({"follow": {"sites": ["a.org"]}}, "follow.sites is needed"),
    ({"follow": {"scope": "sites", "sites": ["http://a.org/"]}}, "is not a host name"),
    ({"follow": {"scope": "sites", "sites": ["*.a.org"]}}, "'*.a.org' is not a host name"),
    ({"follow": {"scope": "sites", "sites": ["a..org"]}}, "is not a host name"),
    ({"follow": {"scope": "sites", "sites": "a.org"}}, "follow.sites must be a list"),
    ({"follow": {"allow": ["(unclosed"]}}, "follow.allow pattern '(unclosed' does not compile"),
    ({"follow": {"deny": ["*bad"]}}, "follow.deny pattern '*bad' does not compile"),
    ({"follow": {"deny": ["/(?!keep)"]}}, "invalid perl operator: (?!"),  # RE2: no lookahead
    ({"follow": {"allow": [r"(a)\1"]}}, "does not compile: invalid escape sequence: \\1"),
    ({"follow": {"deny": ["a\nb"]}}, "one-line strings"),
    ({"follow": {"max_depth": -1}}, "follow.max_depth must be an integer in 0..10000, got -1"),
    ({"follow": {"max_depth": True}}, "follow.max_depth"),
    ({"follow": {"max_pages": 0}}, "follow.max_pages"),
    ({"follow": {"links_per_page": 1_000_000}}, "follow.links_per_page"),
    ({"follow": {"content_types": ["image/png"]}}, "'image/png' is not parsed for links"),
    ({"follow": {"content_types": "text/html"}}, "follow.content_types must be a list"),
    ({"follow": {"depth": 3}}, "unknown follow key 'depth'"),
    ({"sitemaps": {"urls": ["ftp://a.org/s.xml"]}}, "sitemaps.urls: 'ftp://a.org/s.xml': scheme"),
    ({"sitemaps": {"urls": "https://a.org/s.xml"}}, "sitemaps.urls must be a list"),
    ({"sitemaps": {}}, "sitemaps needs urls or robots = true"),
    ({"sitemaps": {"robots": "yes"}}, "sitemaps.robots must be true or false"),
    ({"sitemaps": {"robots": True, "lastmod": True}}, "sitemaps.lastmod feeds revisits"),
    ({"sitemaps": {"robots": True, "every": 1}}, "unknown sitemaps key 'every'"),
    ({"type": "shell", "source_file": None, "follow": {}}, "follow needs type none"),
])
def test_bad_follow_and_sitemaps_tables_rejected_in_one_line(tmp_path: Path, extra, why):
    (tmp_path / "d.sh").write_text("curl \"$1\"\n")
    data = {"name": "n", **extra}
    if data.pop("source_file", 0) is None:
        data["code"] = "d.sh"
    with pytest.raises(ValidationError) as caught:
        validate_manifest(data, tmp_path)
    assert why in str(caught.value) and "\n" not in str(caught.value)


def test_the_manifest_tables_in_docs_name_every_key():
    from common.jobsettings import FOLLOW_DOC, SITEMAPS_DOC

    text = (Path(__file__).parents[2] / "docs" / "crawling.md").read_text()
    documented = set(re.findall(r"^\| `(follow|sitemaps)\.(\w+)` \|", text, re.M))
    assert documented == {("follow", k) for k in FOLLOW_DOC} | {("sitemaps", k) for k in SITEMAPS_DOC}
