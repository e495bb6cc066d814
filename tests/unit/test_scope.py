"""Scope: which found URLs a job follows, with the reason for each refusal."""
from __future__ import annotations

import pytest

from common.jobsettings import MAX_URL_LENGTH, Follow
from common.scope import redirect_refusal, refusal, registrable_domain

PAGE = "https://www.example.co.uk/a"


@pytest.mark.parametrize("host,domain", [
    ("a.b.example.co.uk", "example.co.uk"), ("EXAMPLE.COM.", "example.com"), ("co.uk", "co.uk"),
    ("user.github.io", "user.github.io"),  # a private suffix: each user's site is its own domain
    ("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("localhost", "localhost"),
    ("xn--bcher-kva.de", "xn--bcher-kva.de"), ("www.xn--bcher-kva.de", "xn--bcher-kva.de"),
])
def test_registrable_domain_from_the_bundled_public_suffix_list(host, domain):
    assert registrable_domain(host) == domain


@pytest.mark.parametrize("follow,url,why", [
    (Follow(), "https://www.example.co.uk/b", None),
    (Follow(), "http://www.example.co.uk:8080/b", None),  # one site whatever the scheme and port
    (Follow(), "https://news.example.co.uk/b", "another site than www.example.co.uk"),
    (Follow(scope="domain"), "https://news.example.co.uk/b", None),
    (Follow(scope="domain"), "https://other.co.uk/b", "outside the domain example.co.uk"),
    (Follow(scope="sites", sites=("example.org",)), "https://cdn.example.org/x", None),
    (Follow(scope="sites", sites=("example.org",)), "https://example.org/x", None),
    (Follow(scope="sites", sites=("example.org",)), "https://badexample.org/x", "not one of the job's sites"),
    (Follow(scope="sites", sites=("example.org",)), PAGE, "not one of the job's sites"),
    (Follow(allow=(r"/news/",)), "https://www.example.co.uk/news/1", None),
    (Follow(allow=(r"/news/",)), "https://www.example.co.uk/sport/1", "matches no allow pattern"),
    (Follow(deny=(r"\?(.*&)?sessionid=",)), "https://www.example.co.uk/?a=1&sessionid=2",
     "matches deny pattern"),
    (Follow(allow=("news",), deny=("archive",)), "https://www.example.co.uk/news/archive", "deny"),
    (Follow(), "mailto:x@www.example.co.uk", "not an http(s) URL"),
    (Follow(), "https://www.example.co.uk/" + "x" * MAX_URL_LENGTH, "longer than"),
    (Follow(), "https://[::1/", "malformed URL"),
])
def test_scope_decisions(follow, url, why):
    got = refusal(follow, PAGE, url, depth=1)
    assert got == why if why is None else why in got


def test_depth_and_pages_caps():
    follow = Follow(max_depth=2, max_pages=10)
    url = "https://www.example.co.uk/b"
    assert refusal(follow, PAGE, url, depth=2, pages=9) is None
    assert refusal(follow, PAGE, url, depth=3) == "deeper than max_depth 2"
    assert refusal(follow, PAGE, url, depth=1, pages=10) == "the job has max_pages 10"
    assert refusal(Follow(max_depth=0), PAGE, url, depth=1) == "deeper than max_depth 0"


def test_patterns_match_in_linear_time():
    """``(a+)+$`` against 2,000 a's and a b: Python's re would backtrack for ages, RE2 answers at once."""
    base = "https://www.example.co.uk/"
    url = base + "a" * (MAX_URL_LENGTH - len(base) - 1) + "b"
    assert refusal(Follow(allow=(r"(a+)+$",)), PAGE, url, 1) == "matches no allow pattern"


def test_a_calendar_trap_ends_at_the_depth_cap():
    """Each page of an endless calendar links to the next month: followed until max_depth, then not."""
    follow, page, depth, followed = Follow(max_depth=12), "https://www.example.co.uk/cal/2000/1", 0, 0
    while True:
        year, month = divmod(followed + 1, 12)
        url = f"https://www.example.co.uk/cal/{2000 + year}/{month + 1}"
        if refusal(follow, page, url, depth + 1) is not None:
            break
        page, depth, followed = url, depth + 1, followed + 1
    assert followed == 12


def test_scope_is_judged_against_the_page_task_url_not_a_redirect():
    """A page of the site that redirected to another host: its links judged against the site."""
    assert refusal(Follow(), PAGE, "https://elsewhere.org/x", 1) == "another site than www.example.co.uk"


@pytest.mark.parametrize("follow,target,why", [
    (Follow(), "http://www.example.co.uk:8080/b#top", None),  # the same site, any scheme and port
    (Follow(), "https://example.co.uk/a", "another site than www.example.co.uk"),
    (Follow(scope="domain"), "https://shop.example.co.uk/", None),
    (Follow(deny=("/login",)), "https://www.example.co.uk/login?next=/a", "matches deny pattern '/login'"),
    (Follow(allow=("/a",)), "https://www.example.co.uk/b", "matches no allow pattern"),
    (Follow(max_depth=0, max_pages=1), "https://www.example.co.uk/b", None),  # the caps are not a redirect's
    (Follow(), "https://www.example.co.uk/" + "x" * MAX_URL_LENGTH,
     f"URL longer than {MAX_URL_LENGTH} characters"),
])
def test_a_redirect_is_judged_as_a_link_of_its_page_caps_aside(follow, target, why):
    assert redirect_refusal(follow, PAGE, target) == why
