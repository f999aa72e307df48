"""The one object the reactor thread and the I/O thread share.

The scheduler (reactor thread) and the pump (I/O thread, pump.py) touch
nothing of each other but this :class:`Exchange`, plus the pump's
``start`` / ``stop_leasing`` / ``begin_close`` / ``finish``. Each field has one
writer, so no lock is needed: ``deque.append`` and ``popleft`` are atomic, and
an int, a bool or a reference is replaced whole. Where both sides write a field
(``starved``), the protocol is spelled out on it.

Written by the reactor thread (the scheduler), read by the I/O thread:

- ``outbox``: operations (ops.py) in the order Scrapy produced them;
- ``feedback``: answers seen by the downloader (politeness.FeedbackBatch);
- ``inflight``: requests handed to the engine and not finished;
- ``served``: requests handed to the engine per site, for weighted fairness
  (the scheduler picks the least served site per weight, the pump leases
  for it first);
- ``local_count``, ``started_locally``: requests kept by this worker because
  they cannot travel (unserializable.py).

Written by the I/O thread, read by the reactor thread:

- ``arrivals``: leased and decoded requests, with their lease;
- ``stats``: counter increments for the crawl stats;
- ``weights``: each site's fairness weight from its policy;
- ``drained``, ``enqueues_done``, ``unsent``: whether the crawl may be over;
- ``legacy``: the migrated scrapy-redis dupefilter set (legacy.py), if any;
- ``seen_epoch``: raised when a Redis primary was replaced, so the scheduler
  forgets the fingerprints it remembers sending (they may not have arrived);
- ``fatal``: the I/O thread crashed.

``kick()`` (either side) wakes the I/O thread; ``wake`` (set by the
scheduler, called by the I/O thread) makes the engine ask for requests.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request

    from .frontier import LeasedEntry
    from .ops import Op

__all__ = ["OUTBOX_FLUSH", "Exchange"]

#: Operations in the outbox that wake the I/O thread at once (it otherwise flushes
#: every STREAMS_FLUSH_INTERVAL_SECONDS).
OUTBOX_FLUSH = 512


def _nothing() -> None:
    return None


def _zero() -> int:
    return 0


@dataclass(slots=True, eq=False)
class Exchange:
    """Queues and flags between the reactor thread and the I/O thread (see the module)."""

    #: prefetched requests that wake the I/O thread when the engine is down to them
    low_water: int = 1
    # -- reactor -> I/O thread
    outbox: deque[Op] = field(default_factory=deque)
    #: (site, kind, value) answers; see politeness.FeedbackBatch
    feedback: deque[tuple[str, str, Any]] = field(default_factory=deque)
    inflight: int = 0
    served: dict[str, float] = field(default_factory=dict)
    local_count: Callable[[], int] = _zero
    #: the crawl has started even if Redis never saw a request (a request kept locally)
    started_locally: bool = False
    # -- I/O thread -> reactor
    arrivals: deque[tuple[Request, LeasedEntry]] = field(default_factory=deque)
    stats: deque[tuple[str, int]] = field(default_factory=deque)
    weights: dict[str, float] = field(default_factory=dict)
    drained: bool = False
    #: enqueue operations whose reply came back; until it matches what the scheduler
    #: queued, the crawl is not drained even if Redis looked so
    enqueues_done: int = 0
    #: operations taken from the outbox but not yet confirmed by Redis
    unsent: bool = False
    legacy: str | None = None
    seen_epoch: int = 0
    fatal: BaseException | None = None
    #: the reactor sets it when it found nothing to hand out; the I/O thread clears it
    #: and calls ``wake`` when requests arrive (it appends the arrivals first)
    starved: bool = True
    wake: Callable[[], None] = _nothing
    kicked: threading.Event = field(default_factory=threading.Event)

    def kick(self) -> None:
        """Wake the I/O thread now."""
        self.kicked.set()

    def put(self, op: Op) -> None:
        """Queue ``op`` for the I/O thread (in order)."""
        outbox = self.outbox
        outbox.append(op)
        if len(outbox) >= OUTBOX_FLUSH:
            self.kicked.set()

    def weight(self, site: str) -> float:
        w = self.weights.get(site, 1.0)
        return w if w > 0 else 1.0

    def may_be_busy(self) -> bool:
        """Operations the I/O thread has not finished (seen from the reactor)."""
        return bool(self.outbox) or self.unsent
