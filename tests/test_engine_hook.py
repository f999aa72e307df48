"""Fails loudly if a Scrapy upgrade moves the engine internals streams-sched hooks."""

from __future__ import annotations

import inspect

import pytest
from scrapy.core.engine import ExecutionEngine, _Slot

pytestmark = pytest.mark.scrapy_matrix


def test_engine_slot_has_the_release_point() -> None:
    """The engine slot still has remove_request (the per-request release), nextcall and inprogress."""
    assert callable(getattr(_Slot, "remove_request", None))
    params = list(inspect.signature(_Slot.__init__).parameters)
    assert params[:4] == ["self", "close_if_idle", "nextcall", "scheduler"]


def test_engine_releases_each_scheduled_request_after_handling_its_output() -> None:
    """_start_scheduled_request chains the slot release after _handle_downloader_output, so the
    release comes after the callback, its follow-ups and its items. If this fails, the ack point
    moved: see streams_sched/worker/engine.py and scrapy/scrapy#7978."""
    source = inspect.getsource(ExecutionEngine._start_scheduled_request)
    handle = source.index("d.addBoth(self._handle_downloader_output, request)")
    release = source.index("d.addBoth(", handle + 1)
    assert "_remove_request" in source[release:].split("\n")[0]
    # Scrapy >= 2.14: a method; 2.13: a function nested in _start_scheduled_request
    remove = getattr(ExecutionEngine, "_remove_request", None)
    assert "self._slot.remove_request(request)" in (inspect.getsource(remove) if remove else source)
    scrape = inspect.getsource(ExecutionEngine._handle_downloader_output)
    assert "self.crawl(result)" in scrape and "enqueue_scrape" in scrape


def test_engine_awaits_closewait_until_it_stops() -> None:
    """start_async awaits self._closewait and stop_async fires it: EngineHooks.fail_crawl swaps it
    to make the crawl fail (STREAMS_UNSERIALIZABLE="error", exit code 1). On Scrapy 2.13 the two
    are the coroutine start() and stop()."""
    start = getattr(ExecutionEngine, "start_async", None) or ExecutionEngine.start
    stop = getattr(ExecutionEngine, "stop_async", None) or ExecutionEngine.stop
    assert "await maybe_deferred_to_future(self._closewait)" in inspect.getsource(start)
    assert "self._closewait.callback(None)" in inspect.getsource(stop)
    assert "self._closewait" in inspect.getsource(ExecutionEngine.__init__)
