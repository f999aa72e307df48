"""The crawl's one clock: Redis ``TIME``, read in a process without a round trip each time.

Every time that one process writes and another reads is Redis time or a duration: the
scripts score the delay queues, indexes and pauses with ``TIME``, heartbeat.lua stamps a
node's record with the time Redis received it, and a process that must name an absolute
time itself (a retry's ``meta["not_before"]``, the revisit bucket a fingerprint goes in, a
dead letter's ``ts``) names it on this clock. A worker's own wall clock may be off by
any amount; its monotonic clock only has to run at the right rate between two readings.

A reading of ``TIME`` (:meth:`RedisClock.sync`, or a reply that carries it:
:meth:`RedisClock.observe`) fixes the offset of Redis' clock from this process's
monotonic clock; between readings the monotonic clock carries it on. The reading is
taken as of the middle of its round trip, so it is off by at most half of it. A worker
reads ``TIME`` once at start and gets a fresh reading with every heartbeat, whose
script returns it (frontier/lua/heartbeat.lua), so the clock costs a page nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from streams_sched.connect.clients import RedisClient

__all__ = ["DEFAULT_MAX_AGE_S", "RedisClock", "time_reply_s"]

#: :meth:`RedisClock.now` reads TIME again once its last reading is this old
DEFAULT_MAX_AGE_S = 60.0


def time_reply_s(reply: Sequence[Any]) -> float:
    """Epoch seconds of a TIME reply ``[seconds, microseconds]`` (as bytes, str or int)."""
    return int(reply[0]) + int(reply[1]) / 1e6


class RedisClock:
    """Redis TIME in epoch seconds, from this process's monotonic clock and the last reading.

    ``now()`` may read TIME (no reading yet, or one older than ``max_age_s``); ``estimate()``
    never does, so a thread that must not talk to Redis (a worker's reactor) calls it.
    """

    def __init__(
        self, client: RedisClient, max_age_s: float = DEFAULT_MAX_AGE_S, monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.max_age_s = max_age_s
        self._monotonic = monotonic
        #: (Redis time minus the monotonic clock, monotonic time of the reading), or None
        self._reading: tuple[float, float] | None = None

    def observe(self, reply: Sequence[Any], sent: float, received: float) -> None:
        """Take a TIME reply that Redis sent between the monotonic times ``sent`` and ``received``."""
        self._reading = (time_reply_s(reply) - (sent + received) / 2, received)

    def sync(self) -> float:
        """Read TIME now (one round trip); return it."""
        sent = self._monotonic()
        reply = self.client.time()
        self.observe(reply, sent, self._monotonic())
        return self.estimate()

    def now(self) -> float:
        """Redis time now; reads TIME first when the last reading is missing or too old."""
        reading = self._reading
        mono = self._monotonic()
        if reading is None or mono - reading[1] > self.max_age_s:
            return self.sync()
        return mono + reading[0]

    def estimate(self) -> float:
        """Redis time now from the last reading, without a round trip; the wall clock of
        this process until there is one."""
        reading = self._reading
        if reading is None:
            return time.time()
        return self._monotonic() + reading[0]

    @property
    def read(self) -> bool:
        """True once TIME was read."""
        return self._reading is not None
