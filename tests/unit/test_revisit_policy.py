"""The revisit policy (``common/revisit.py``): intervals, validators, what counts as unchanged."""
from __future__ import annotations

from common.revisit import Revisit, digest, response_validators, unchanged, validators
from common.store.jobs import UNSET
from common.store.records import JobSettings, Prev


def test_fixed_interval_never_moves():
    rv = Revisit(3600)
    assert rv.on and rv.next_interval(None, True) == rv.next_interval(3600, False) == 3600


def test_adaptive_interval_halves_on_change_doubles_without_within_bounds():
    rv = Revisit.of(JobSettings.from_doc({"revisit": 60, "revisit_max": 600}))
    assert rv.next_interval(None, False) == 60  # a first visit starts at the floor
    seen, every = [], 60.0
    for _ in range(5):
        every = rv.next_interval(every, changed=False)
        seen.append(every)
    assert seen == [120, 240, 480, 600, 600]
    assert rv.next_interval(600, changed=True) == 300
    assert rv.next_interval(90, changed=True) == 60


def test_off_and_validators():
    assert not Revisit.of(UNSET).on
    assert not Revisit.of(JobSettings.from_doc({"revisit": 0, "revisit_max": 0})).on
    assert validators(None) == {}
    assert validators(Prev(etag='"v1"', last_modified="Tue, 14 Nov 2023 22:13:20 GMT")) == {
        "If-None-Match": '"v1"', "If-Modified-Since": "Tue, 14 Nov 2023 22:13:20 GMT"}
    assert response_validators({"etag": "x", "LAST-MODIFIED": "y"}) == ("x", "y")
    # a hostile page or downloader: a validator that could not be sent back, or would bloat
    # every entry of its revisits, is not kept
    assert response_validators({"ETag": '"a"\r\nX-Injected: 1', "Last-Modified": "d" * 600}) == (None, None)


def test_unchanged_needs_a_stored_version():
    body = b"<p>same</p>"
    prev = Prev(data_lease="L1", digest=digest(body))
    assert unchanged(None, 304, b"") is None  # a first visit always stores
    assert unchanged(Prev(digest=digest(body)), 200, body) is None  # nothing stored yet
    assert unchanged(prev, 304, b"") == "HTTP 304"
    assert unchanged(prev, 200, body) == "same content"
    assert unchanged(prev, 200, b"<p>new</p>") is None
