"""Test-only: this process's wall clock is ``DOWNCLUSTER_TEST_CLOCK_SKEW`` seconds off, as on a
host whose clock is wrong. ``time.time``/``time_ns`` and ``datetime``'s ``now``/``utcnow``/
``today`` are shifted; the monotonic clock is not (it is never compared between hosts).

Put this directory first on PYTHONPATH. libfaketime would shift the C library's clocks instead,
but with Debian's 0.9.10 every timed wait of Python (``Event.wait``, ``Queue.get(timeout=)``)
never returns, and with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` every ``time.sleep`` fails (EINVAL):
the skewed worker's heartbeat stops, which is not what a skewed clock does.
"""
import copyreg
import datetime
import os
import time

_skew = float(os.environ.get("DOWNCLUSTER_TEST_CLOCK_SKEW") or 0)

if _skew:
    _real, _delta = datetime.datetime, datetime.timedelta(seconds=_skew)
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _skew
    time.time_ns = lambda: _time_ns() + int(_skew * 1e9)

    class _Meta(type):
        def __instancecheck__(cls, obj):  # datetimes made in C (bson, fromisoformat) are real ones
            return isinstance(obj, _real)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, _real)

    class _SkewedDatetime(_real, metaclass=_Meta):
        @classmethod
        def now(cls, tz=None):
            return _real.now(tz) + _delta

        @classmethod
        def utcnow(cls):
            return _real.now(datetime.timezone.utc).replace(tzinfo=None) + _delta

        @classmethod
        def today(cls):
            return _real.now() + _delta

    _SkewedDatetime.__name__ = _SkewedDatetime.__qualname__ = "datetime"
    _SkewedDatetime.__module__ = "datetime"
    datetime.datetime = _SkewedDatetime
    copyreg.pickle(_real, lambda d: (_SkewedDatetime, d.__reduce__()[1]))  # pickle finds it by name
