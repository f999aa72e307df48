"""The six places where streams-sched reaches into Scrapy's engine.

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

Its kind changed in Scrapy 2.14: up to 2.13 ``_Slot.close()`` returns a
Deferred that ``close_spider`` chains with ``addBoth``; from 2.14 it is a
coroutine function that ``close_spider_async`` awaits. The replacement returns
what the installed engine expects (a coroutine wrapped in a Deferred for 2.13).

The fourth, only with ``STREAMS_UNSERIALIZABLE = "error"``, is the engine's
``_closewait``, the Deferred that ``ExecutionEngine.start_async`` awaits until
the engine stops: :meth:`EngineHooks.fail_crawl` puts a stand-in there that, when
the engine stops, leaves the crawler without its spider, so
``CrawlerProcess.bootstrap_failed`` is set and ``scrapy crawl`` (and ``runspider``,
and scripts that check it) exit with code 1. Scrapy has no public way for a
component to set the exit code.

The fifth is the downloader middleware manager's ``methods["process_exception"]``:
:meth:`EngineHooks.on_download_error` puts an observer first in it (closest to
the download handler, before RetryMiddleware turns a timeout into a retry), so
the scheduler sees download timeouts without the user adding a middleware, and
ends a browser task's failed delivery there (renders.py) before any other
middleware or the errback sees it.

The sixth, only on Scrapy 2.13 and only while the scheduler's ``open`` waits for Redis
to accept writes (start_wait.py), is the engine's ``stop``: 2.13's ``Crawler.stop``
calls it whenever the crawler is crawling, and it raises "Engine not running" if the
engine has not started yet, so a SIGTERM during that wait ended in a traceback.
:func:`tolerate_stop_before_start` makes it a no-op until the engine runs, as 2.14's
``Crawler.stop_async`` does by checking ``engine.running`` first.

All are private. :func:`check_scrapy` (the version against the supported range,
the slot class's methods) runs when the scheduler is built, and
:class:`EngineHooks` checks the slot instance when the spider opens; both raise
:class:`~streams_sched.errors.ScrapyCompatError`, which the worker reports as
one line and exits 1. ``tests/test_engine_hook.py`` fails loudly too, and
``scripts/matrix.sh`` runs the tests that touch the engine on every supported
Scrapy version.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request

from streams_sched.errors import RequestsRefused, ScrapyCompatError

__all__ = ["SUPPORTED_SCRAPY", "EngineHooks", "check_scrapy", "close_spider", "thread_safe_caller"]

#: The Scrapy releases streams-sched is tested on (scripts/matrix.sh and the main
#: suite); pyproject.toml declares the same range (tests/test_scrapy_compat.py).
SUPPORTED_SCRAPY = ">=2.13.4,<2.20"

#: what the engine slot must have: methods of the class, attributes of the instance
_SLOT_METHODS = ("remove_request", "close")
_SLOT_ATTRIBUTES = ("remove_request", "nextcall", "inprogress", "scheduler", "close")

logger = logging.getLogger(__name__)


def check_scrapy(version: str | None = None, allow_untested: bool = False) -> None:
    """Raise ScrapyCompatError unless the installed Scrapy (or ``version``) is in
    :data:`SUPPORTED_SCRAPY` and its engine slot has the methods streams-sched hooks.

    ``allow_untested`` (STREAMS_ALLOW_UNTESTED_SCRAPY) lets a release above the
    range start, to try it; the hook points are checked all the same."""
    import scrapy
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    version = version or scrapy.__version__
    supported = SpecifierSet(SUPPORTED_SCRAPY)
    hint = f"install a supported one: pip install 'scrapy{SUPPORTED_SCRAPY}'"
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ScrapyCompatError(
            f"Scrapy {version!r} is not a version streams-sched understands; it supports Scrapy {SUPPORTED_SCRAPY}: {hint}"
        ) from None
    if not supported.contains(parsed, prereleases=True):
        above = all(parsed >= Version(spec.version) for spec in supported if spec.operator.startswith(">"))
        if not (above and allow_untested):
            extra = " (or set STREAMS_ALLOW_UNTESTED_SCRAPY=True to try it)" if above else ""
            raise ScrapyCompatError(
                f"Scrapy {version} is not supported: streams-sched supports Scrapy {SUPPORTED_SCRAPY}; {hint}{extra}"
            )
        logger.warning(
            "Scrapy %s is above the tested range %s (STREAMS_ALLOW_UNTESTED_SCRAPY is set):"
            " run scripts/matrix.sh %s before relying on it",
            version, SUPPORTED_SCRAPY, version,
        )
    from scrapy.core import engine

    slot_class = getattr(engine, "_Slot", None)
    missing = [name for name in _SLOT_METHODS if not callable(getattr(slot_class, name, None))]
    if slot_class is None or missing:
        raise ScrapyCompatError(
            f"Scrapy {version}'s engine no longer has the hook points streams-sched needs"
            f" (scrapy.core.engine._Slot{'.' + '/'.join(missing) if slot_class is not None else ''} is missing);"
            f" streams-sched supports Scrapy {SUPPORTED_SCRAPY}: {hint}"
        )


def close_spider(engine: Any, reason: str) -> None:
    """Ask the engine to close the spider (``close_spider_async`` from Scrapy 2.14,
    ``close_spider`` before)."""
    from scrapy.utils.defer import deferred_from_coro

    if hasattr(engine, "close_spider_async"):
        deferred_from_coro(engine.close_spider_async(reason=reason))
    else:
        engine.close_spider(engine.spider, reason)


def tolerate_stop_before_start(crawler: Any) -> None:
    """On Scrapy 2.13 (no ``Crawler.stop_async``): stopping the crawler before its engine
    started is a no-op, not a RuntimeError (see the module docstring)."""
    engine = getattr(crawler, "engine", None)
    if engine is None or hasattr(crawler, "stop_async"):
        return
    stop = engine.stop

    def stop_if_running() -> Any:
        if not engine.running:
            from twisted.internet.defer import succeed

            return succeed(None)
        return stop()

    engine.stop = stop_if_running


def thread_safe_caller() -> Callable[..., Any]:
    """Return a function that runs ``f(*args)`` on the reactor / event-loop thread."""
    from scrapy.utils.reactor import is_reactor_installed

    if is_reactor_installed():
        from twisted.internet import reactor

        return reactor.callFromThread  # type: ignore[no-any-return]
    loop = asyncio.get_running_loop()
    return loop.call_soon_threadsafe


def next_turn_caller() -> Callable[..., Any]:
    """Return a function that runs ``f()`` on a later turn of the reactor / event loop;
    call it on that thread."""
    from scrapy.utils.reactor import is_reactor_installed

    if is_reactor_installed():
        from twisted.internet import reactor

        def later(f: Callable[[], Any]) -> None:
            reactor.callLater(0, f)  # type: ignore[arg-type]

        return later
    loop = asyncio.get_running_loop()
    return loop.call_soon


class EngineHooks:
    """Hooks the engine slot of a running crawl for one scheduler."""

    def __init__(
        self,
        crawler: Any,
        scheduler: Any,
        on_release: Callable[[Request], None],
        *,
        fail_at_end: bool = False,
    ) -> None:
        import scrapy

        engine = getattr(crawler, "engine", None)
        slot: Any = getattr(engine, "_slot", None)
        if slot is None:
            missing = ["engine._slot"]
        else:
            missing = [f"engine._slot.{name}" for name in _SLOT_ATTRIBUTES if not hasattr(slot, name)]
        if fail_at_end and not hasattr(engine, "_closewait"):
            missing.append("engine._closewait")
        if missing:
            raise ScrapyCompatError(
                f"Scrapy {scrapy.__version__}'s engine no longer has the hook points streams-sched needs"
                f" ({', '.join(missing)} missing);"
                f" streams-sched supports Scrapy {SUPPORTED_SCRAPY}: install one of those and report it"
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
        self.next_turn = next_turn_caller()

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

        async def close_async() -> None:
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

        if inspect.iscoroutinefunction(original):
            # Scrapy >= 2.14: close_spider_async awaits slot.close()
            slot.close = close_async
        else:
            # Scrapy 2.13: close_spider chains callbacks on the Deferred slot.close() returns
            from scrapy.utils.defer import deferred_from_coro

            def close_deferred() -> Any:
                return deferred_from_coro(close_async())

            slot.close = close_deferred
        self._original_close = original

    def fail_crawl(self, message: str) -> bool:
        """Make the crawl end as failed once the engine stops, so that ``scrapy crawl``
        exits with code 1: log ``RequestsRefused: <message>`` as CRITICAL and leave the
        crawler without its spider, the mark by which every supported Scrapy's
        ``CrawlerProcess`` sets ``bootstrap_failed``. False if the engine is not running.

        Raising instead does not work on every supported version: Scrapy 2.13 and 2.14
        do not count a crawl that raised as failed (it exits 0), and 2.13's error path
        closes the downloader a second time. ``start_async`` awaits ``_closewait`` and
        ``stop_async`` fires it (``start`` and ``stop`` on 2.13), after the spider is
        closed and ``engine_stopped`` was sent: a stand-in takes its place and, when
        fired, does the above and then fires the original."""
        from twisted.internet.defer import Deferred

        engine: Any = self._engine
        awaited = getattr(engine, "_closewait", None)
        if not isinstance(awaited, Deferred) or awaited.called:
            logger.error("streams-sched cannot set the exit code: the engine is not running (%s)", message)
            return False
        crawler = engine.crawler

        def fail(_: Any) -> None:
            logger.critical("%s: %s", RequestsRefused.__name__, message)
            crawler.spider = None
            awaited.callback(None)

        stand_in: Deferred[None] = Deferred()
        stand_in.addCallback(fail)
        engine._closewait = stand_in
        return True
    def on_download_error(self, observe: Callable[[Request, BaseException], Request | None]) -> None:
        """Call ``observe(request, exception)`` for every failed download (it must not
        raise). None: the exception goes on to the other middlewares unchanged; a
        request: the download ends with it, as a middleware's process_exception may
        end it (the engine schedules the request)."""
        downloader = getattr(self._engine, "downloader", None)
        methods = getattr(getattr(downloader, "middleware", None), "methods", None)
        chain = methods.get("process_exception") if isinstance(methods, dict) else None
        if chain is None or not hasattr(chain, "appendleft"):
            raise ScrapyCompatError(
                "streams-sched needs the downloader middleware manager's methods['process_exception']"
                " deque to see download timeouts; this Scrapy version moved it. Set"
                " STREAMS_ADAPTIVE=False or pin scrapy to a tested version (see docs/scrapy-versions.md) and report it."
            )

        def process_exception(request: Request, exception: BaseException, spider: Any = None) -> Request | None:
            try:
                return observe(request, exception)
            except Exception:
                logger.exception("streams-sched could not record a download error")
                return None

        chain.appendleft(process_exception)
        self._exception_chain = chain
        self._exception_observer = process_exception

    def pull(self) -> None:
        """On the reactor thread: have the engine ask for requests on its next turn."""
        self._nextcall.schedule()

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


def _on_asyncio() -> bool:
    """True when coroutines run on an asyncio loop (the asyncio reactor, or no reactor)."""
    try:
        from scrapy.utils.asyncio import is_asyncio_available  # Scrapy >= 2.14
    except ImportError:  # Scrapy 2.13: always a Twisted reactor
        from scrapy.utils.reactor import is_asyncio_reactor_installed

        return is_asyncio_reactor_installed()
    return is_asyncio_available()


async def _finished_within(coro: Any, timeout_s: float) -> bool:
    """Await ``coro`` (a coroutine or a Deferred) for at most ``timeout_s`` seconds
    (it keeps running after); True if it finished in time. Works on asyncio and on
    other Twisted reactors."""
    from twisted.internet import defer

    if _on_asyncio():
        if isinstance(coro, defer.Deferred):
            coro = coro.asFuture(asyncio.get_running_loop())
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        return bool(done)
    from scrapy.utils.defer import deferred_from_coro
    from twisted.internet import reactor as installed

    reactor: Any = installed
    finished = deferred_from_coro(coro)
    timer: defer.Deferred[None] = defer.Deferred()
    call = reactor.callLater(timeout_s, timer.callback, None)
    await defer.DeferredList([finished, timer], fireOnOneCallback=True, consumeErrors=True)
    if call.active():
        call.cancel()
    return bool(finished.called)
