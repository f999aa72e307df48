"""The two places where streams-sched reaches into Scrapy's engine.

Scrapy has no public "request finished" hook (scrapy/scrapy#7978). The exact
point is the engine slot's ``remove_request``: the engine calls it once per
scheduled request after the download, the callback or errback, every request
the callback yielded (already passed to ``enqueue_request``) and its items
through the pipelines are done; also after a redirect or retry (the new
request is scheduled first), an IgnoreRequest, a download error or a callback
exception. ``ExecutionEngine._start_scheduled_request`` chains it with
``addBoth`` after ``_handle_downloader_output``.

The second is the slot's ``nextcall``, which the I/O thread schedules (through
the reactor's thread-safe call) when prefetched requests arrive, so the engine
does not wait for its 5-second heartbeat.

The third is the slot's ``close``, which the engine awaits first when the
spider closes (SIGTERM / Ctrl-C, CLOSESPIDER_*, the end of the crawl): it
waits until every request in progress is done. :meth:`EngineHooks.on_closing`
runs a callback when closing begins (the scheduler stops leasing and hands
back what it has not started) and bounds that wait.

The fourth is the downloader middleware manager's ``methods["process_exception"]``:
:meth:`EngineHooks.on_download_error` puts an observer first in it (closest to
the download handler, before RetryMiddleware turns a timeout into a retry), so
the scheduler sees download timeouts without the user adding a middleware.

All are private. :class:`EngineHooks` checks them at start and raises
:class:`~streams_sched.errors.ScrapyCompatError` if a Scrapy upgrade moved
them; ``tests/test_engine_hook.py`` fails loudly too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request

from .errors import ScrapyCompatError

__all__ = ["EngineHooks", "thread_safe_caller"]

logger = logging.getLogger(__name__)


def thread_safe_caller() -> Callable[..., Any]:
    """Return a function that runs ``f(*args)`` on the reactor / event-loop thread."""
    from scrapy.utils.reactor import is_reactor_installed

    if is_reactor_installed():
        from twisted.internet import reactor

        return reactor.callFromThread  # type: ignore[no-any-return]
    loop = asyncio.get_running_loop()
    return loop.call_soon_threadsafe


class EngineHooks:
    """Hooks the engine slot of a running crawl for one scheduler."""

    def __init__(self, crawler: Any, scheduler: Any, on_release: Callable[[Request], None]) -> None:
        engine = getattr(crawler, "engine", None)
        slot = getattr(engine, "_slot", None)
        missing = [
            name
            for name in ("remove_request", "nextcall", "inprogress", "scheduler", "close")
            if not hasattr(slot, name)
        ]
        if slot is None or missing:
            raise ScrapyCompatError(
                "streams-sched needs the engine slot's remove_request/nextcall"
                f" (missing: {missing or ['_slot']}); this Scrapy version moved them."
                " Pin scrapy to a tested version (see README) and report it."
            )
        if slot.scheduler is not scheduler:
            raise ScrapyCompatError(
                "the engine slot belongs to another scheduler; open() was called out of order"
            )
        original = slot.remove_request

        def remove_request(request: Request) -> None:
            try:
                original(request)
            finally:
                on_release(request)

        slot.remove_request = remove_request
        self._engine = engine
        self._slot = slot
        self._original = original
        self._nextcall = slot.nextcall
        self._call = thread_safe_caller()

    def on_closing(
        self,
        begin: Callable[[], None],
        timeout_s: float,
        timed_out: Callable[[int], None],
    ) -> None:
        """When the spider starts closing, call ``begin()``; then let the requests in
        progress finish for at most ``timeout_s`` seconds, after which
        ``timed_out(n_still_in_progress)`` is called and the engine closes anyway."""
        slot = self._slot
        original = slot.close

        async def close() -> None:
            try:
                begin()
            except Exception:
                logger.exception("streams-sched could not prepare the close")
            if await _finished_within(original(), timeout_s):
                return
            try:
                timed_out(len(slot.inprogress))
            except Exception:
                logger.exception("streams-sched could not hand back the requests in progress")

        slot.close = close
        self._original_close = original

    def on_download_error(self, observe: Callable[[Request, BaseException], None]) -> None:
        """Call ``observe(request, exception)`` for every failed download (it must not
        raise; the exception goes on to the other middlewares unchanged)."""
        downloader = getattr(self._engine, "downloader", None)
        methods = getattr(getattr(downloader, "middleware", None), "methods", None)
        chain = methods.get("process_exception") if isinstance(methods, dict) else None
        if chain is None or not hasattr(chain, "appendleft"):
            raise ScrapyCompatError(
                "streams-sched needs the downloader middleware manager's methods['process_exception']"
                " deque to see download timeouts; this Scrapy version moved it. Set"
                " STREAMS_ADAPTIVE=False or pin scrapy to a tested version (see README) and report it."
            )

        def process_exception(request: Request, exception: BaseException, spider: Any = None) -> None:
            try:
                observe(request, exception)
            except Exception:
                logger.exception("streams-sched could not record a download error")

        chain.appendleft(process_exception)
        self._exception_chain = chain
        self._exception_observer = process_exception

    def wake(self) -> None:
        """From any thread: ask the engine to pull requests now."""
        try:
            self._call(self._nextcall.schedule)
        except RuntimeError:  # reactor / loop already stopped
            pass

    def unhook(self) -> None:
        self._slot.remove_request = self._original
        chain = getattr(self, "_exception_chain", None)
        if chain is not None:
            try:
                chain.remove(self._exception_observer)
            except ValueError:
                pass
        original_close = getattr(self, "_original_close", None)
        if original_close is not None:
            self._slot.close = original_close


async def _finished_within(coro: Any, timeout_s: float) -> bool:
    """Await ``coro`` for at most ``timeout_s`` seconds (it keeps running after);
    True if it finished in time. Works on asyncio and on other Twisted reactors."""
    from scrapy.utils.asyncio import is_asyncio_available

    if is_asyncio_available():
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        return bool(done)
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import defer
    from twisted.internet import reactor as installed

    reactor: Any = installed
    finished = deferred_from_coro(coro)
    timer: defer.Deferred[None] = defer.Deferred()
    call = reactor.callLater(timeout_s, timer.callback, None)
    await defer.DeferredList([finished, timer], fireOnOneCallback=True, consumeErrors=True)
    if call.active():
        call.cancel()
    return bool(finished.called)
