"""The request consumer's fetch wait: short while Kafka requests come, longer once idle."""

from __future__ import annotations

import inspect

from aiokafka.consumer.fetcher import Fetcher

from streams.respond.http import FetchWait, set_fetch_wait
from streams.settings import Settings


def test_wait_goes_long_when_idle_and_short_on_the_next_request() -> None:
    w = FetchWait(short=5, idle=50, idle_after_s=30.0, now=0.0)
    assert w.observe(False, 10.0) is None and w.current == 5  # not idle long enough
    assert w.observe(True, 20.0) is None  # a request: the quiet spell starts again
    assert w.observe(False, 49.0) is None
    assert w.observe(False, 50.0) == 50 and w.current == 50
    assert w.observe(False, 80.0) is None  # already idle: no second switch
    assert w.observe(True, 81.0) == 5 and w.current == 5
    assert w.observe(True, 81.1) is None


def test_equal_waits_never_switch() -> None:
    w = FetchWait(short=5, idle=5, idle_after_s=1.0, now=0.0)
    assert [w.observe(False, t) for t in (2.0, 9.0)] == [None, None]


def test_defaults_idle_longer_than_short() -> None:
    r = Settings().respond
    assert r.idle_fetch_max_wait_ms > r.fetch_max_wait_ms and r.idle_after_s > 0


class _Consumer:
    def __init__(self, fetcher: object | None) -> None:
        self._fetcher = fetcher


class _Fetcher:
    _fetch_max_wait_ms = 5


def test_set_fetch_wait_on_the_fetcher_that_aiokafka_reads_per_request() -> None:
    f = _Fetcher()
    assert set_fetch_wait(_Consumer(f), 50) and f._fetch_max_wait_ms == 50
    assert not set_fetch_wait(_Consumer(None), 50)  # not started
    assert not set_fetch_wait(_Consumer(object()), 50)  # an aiokafka that keeps it elsewhere
    # the installed aiokafka builds each fetch request from this attribute
    assert "self._fetch_max_wait_ms" in inspect.getsource(Fetcher._get_actions_per_node)
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in inspect.getsource(Fetcher.__init__)
