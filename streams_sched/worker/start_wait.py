"""A worker that starts while Redis refuses writes waits for them, as it does mid-crawl.

The start writes to Redis: the crawl's dedupe back-end and layout, its registry entry,
STREAMS_SITE_KEY and STREAMS_SITES, the node record. A Redis at ``maxmemory``
(OOM), one whose snapshots fail (MISCONF) or a replica (READONLY) refuses all of
them (connect/writable.py). :func:`open_when_writable` runs those writes; each is safe
to repeat. If Redis takes them, all happens at once, as it always did. If it refuses
them, one ERROR line names the Redis setting and the fix, and the writes are tried
again with back-off (0.1 s doubling to 5 s) on a thread of their own, while the
reactor runs on: SIGTERM and Ctrl-C still stop the worker, and other crawlers of the
process go on. The scheduler's ``open`` returns a Deferred that fires once the
worker has started; Scrapy waits for it before it starts the engine, so no request
is taken or sent before. A WARNING says when Redis took the writes and how long it
refused them.

Anything else that ends the wait (a dedupe back-end that does not match, say) fails
the start as at once, through ``failed``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import Deferred

from streams_sched.connect.clients import TRANSIENT
from streams_sched.connect.server_checks import hint_for, refuses_writes
from streams_sched.connect.waiting import one_line
from streams_sched.connect.writable import WriteWait
from streams_sched.worker.engine import thread_safe_caller

__all__ = ["open_when_writable"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: the kind a connection error counts as while waiting (WriteWait says each kind once)
_UNREACHABLE = "unreachable"


def open_when_writable(
    attempt: Callable[[], T], opened: Callable[[T], None], where: str, failed: Callable[[Any], Any],
) -> Deferred[None] | None:
    """Run ``attempt`` (the start's writes, safe to repeat), then ``opened`` with its result.

    None if both ran now. A Deferred if Redis refused a write or did not answer (a cluster
    master that died after the client read the slot map, not yet failed over): ``attempt``
    is tried again with back-off on a thread until Redis takes it, and the Deferred fires
    once ``opened`` has run on the reactor; ``failed`` is its errback. ``where`` names the
    server in the log ("Redis at redis://host:6379/0").
    """
    wait = WriteWait()
    try:
        result = attempt()
    except Exception as exc:
        if not (refuses_writes(exc) or isinstance(exc, TRANSIENT)):
            raise
        _say(wait, where, exc)
    else:
        opened(result)
        return None
    done: Deferred[None] = Deferred()
    done.addErrback(failed)
    call = thread_safe_caller()
    stop = threading.Event()
    _stop_at_shutdown(stop)

    def finish(result: T) -> None:
        try:
            opened(result)
        except Exception:
            done.errback()
        else:
            done.callback(None)

    def run() -> None:
        while not stop.wait(wait.delay()):
            try:
                result = attempt()
            except Exception as exc:
                if refuses_writes(exc) or isinstance(exc, TRANSIENT):
                    _say(wait, where, exc)
                    continue
                call(done.errback, exc)
                return
            refused_writes = bool(wait.said - {_UNREACHABLE})
            ended = wait.accepted()
            if ended is not None:
                logger.warning(
                    "%s %s after %.1fs (%d tries); streams-sched starts",
                    where, "accepts writes again" if refused_writes else "answers again", *ended,
                )
            call(finish, result)
            return

    threading.Thread(target=run, name="streams-sched-start-wait", daemon=True).start()
    return done


def _say(wait: WriteWait, where: str, exc: BaseException) -> None:
    """Count a refused try; say a new kind of refusal once (ERROR; unreachable: WARNING)."""
    code = refuses_writes(exc)
    if not wait.refuse(code or _UNREACHABLE):
        return
    text = one_line(exc).rstrip(".")
    if not code:
        logger.warning("%s is unreachable while streams-sched waits to start (%s); retrying with back-off", where, text)
        return
    hint = hint_for(text)
    logger.error(
        "streams-sched cannot start yet: %s refuses writes (%s). %s%s. Retrying with back-off;"
        " the crawl starts once Redis accepts writes, and nothing is leased or sent before",
        where, text, hint[0].upper(), hint[1:],
    )


def _stop_at_shutdown(stop: threading.Event) -> None:
    """End the wait when the reactor stops (SIGTERM, Ctrl-C), so the thread is not left trying."""
    from scrapy.utils.reactor import is_reactor_installed

    if is_reactor_installed():
        from twisted.internet import reactor

        reactor.addSystemEventTrigger("before", "shutdown", stop.set)  # type: ignore[arg-type]
