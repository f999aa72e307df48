"""PROTOTYPE (bench, issue 5): run the Pump's cycles on the reactor thread.

Not for merge as is. Measures what the I/O thread costs a worker: with one
GIL, every pump cycle on its own thread means GIL hand-offs, context switches
and a reactor woken through its self-pipe. Here the same ``Pump._cycle`` runs
from ``reactor.callLater`` on the reactor thread (its round trip, ~100 us,
blocks the reactor). Enable with ``STREAMS_INLINE_PUMP = True``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .pump import TRANSIENT, Pump

logger = logging.getLogger(__name__)


class InlinePump:
    def __init__(self, pump: Pump, wake: Any) -> None:
        from twisted.internet import reactor

        self.pump = pump
        self.reactor: Any = reactor
        self._call: Any = None
        pump.kick = self.kick  # type: ignore[method-assign]
        pump.wake = wake

    def start(self) -> None:
        self._schedule(0.0)

    def kick(self) -> None:
        call = self._call
        if call is not None and call.active() and call.getTime() - self.reactor.seconds() > 0.0005:
            call.reset(0)
        elif call is None:
            self._schedule(0.0)

    def _schedule(self, delay: float) -> None:
        self._call = self.reactor.callLater(delay, self._step)

    def _step(self) -> None:
        self._call = None
        p = self.pump
        if p._stop_requested:
            return
        self._one_cycle()
        self._schedule(max(p._wait_time(), p.backoff))

    def _one_cycle(self) -> None:
        p = self.pump
        p._kick.clear()
        try:
            p._cycle()
            p.backoff = 0.0
        except TRANSIENT as exc:
            p._on_outage(exc)
        except Exception:
            logger.exception("streams-sched I/O cycle failed; retrying")
            p.backoff = min(max(p.backoff * 2, 0.1), 5.0)
        p._cycles += 1

    def finish(self, timeout: float) -> bool:
        p = self.pump
        p._stop_requested = True
        if self._call is not None and self._call.active():
            self._call.cancel()
        deadline = time.monotonic() + timeout
        while (p.outbox or p._unsent()) and time.monotonic() < deadline:
            self._one_cycle()
            if p.backoff:
                time.sleep(p.backoff)
        p._goodbye()
        return not p._unsent() and not p.outbox
