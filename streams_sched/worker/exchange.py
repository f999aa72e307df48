"""The one object the reactor thread and the I/O thread share.

The scheduler (reactor thread) and the I/O thread (io/cycle.py) touch nothing of
each other but this :class:`Exchange`, plus the I/O thread's ``start`` /
``stop_leasing`` / ``begin_close`` / ``finish``. Each field has one writer, named
below, so no lock is needed: ``deque.append`` and ``popleft`` are atomic, and an
int, a bool or a reference is replaced whole. The other thread only reads it (or, for
a queue, takes from it). Where both sides write a field (``starved``), the protocol
is spelled out on it. tests/test_exchange.py checks that every field is listed here
with its writer, and that nothing else assigns it.

Written on the reactor thread, read by the I/O thread:

- ``outbox`` (writer: ``StreamsScheduler``, through :meth:`Exchange.put`): operations
  (ops.py) in the order Scrapy produced them;
- ``feedback`` (writer: ``Answers``, answers.py): answers seen by the downloader
  (politeness.FeedbackBatch);
- ``inflight`` (writer: ``StreamsScheduler``): requests handed to the engine and not finished;
- ``served`` (writer: ``ReadyQueues``, ready.py): requests handed to the engine per
  site, for weighted fairness (the scheduler picks the least served site per weight;
  the I/O thread keeps each site's holding to its weighted share,
  selection.plan_shards); only for the sites the scheduler has requests of, ready or
  in progress: a site that comes back starts close to the least served anyway
  (selection.returning_credit), so the worker's memory follows the sites it holds;
- ``local_count``, ``started_locally`` (writer: ``StreamsScheduler``): requests kept by
  this worker because they cannot travel (unserializable.py);
- ``renders``, ``render_s`` (writer: ``Answers``): browser downloads finished and
  the seconds they spent in the downloader (for the node record);
- ``wake`` (writer: ``StreamsScheduler``, at start): makes the engine ask for requests.

Written on the I/O thread, read by the reactor thread:

- ``low_water`` (writer: ``IOThread``, at start): prefetched requests that wake the
  I/O thread when the engine is down to them;
- ``arrivals`` (writer: ``Leasing``, io/leasing.py): leased and decoded requests, with their lease;
- ``stats`` (writer: ``io``, the I/O thread: a queue of counts, each of its parts
  appends its own, and only the scheduler takes them): counter increments for the
  crawl stats;
- ``weights`` (writer: ``Leasing``; the scheduler forgets through :class:`SiteWeights`'
  protocol): each site's fairness weight from its policy (only weights other than 1);
- ``drained`` (writer: ``DrainCheck``, io/drain_check.py): the crawl is drained in Redis;
- ``enqueues_done`` (writer: ``IOThread``): enqueue operations whose reply came back;
  until it matches what the scheduler queued, the crawl is not over (worker/drain.py);
- ``unsent`` (writer: ``IOThread``): operations taken from the outbox, not yet confirmed;
- ``legacy`` (writer: ``IOThread``, from the crawl's meta): the migrated scrapy-redis
  dupefilter set (legacy.py), if any;
- ``seen_epoch`` (writer: ``ReplicaBarrier``, io/barrier.py): raised when a Redis
  primary was replaced, so the scheduler forgets the fingerprints it remembers
  sending (they may not have arrived);
- ``fatal`` (writer: ``IOThread``): the I/O thread crashed;
- ``moved`` (writer: ``IOThread``): where the crawl has moved (``streams-sched move``),
  once a lease reply or a refused enqueue said so (frontier/moves.py);
- ``unreachable_since`` (writer: ``Trouble``, io/trouble.py): since when
  (``time.monotonic()``) no Redis server answered a cycle (None while they do);
- ``cycle_started`` (writer: ``IOThread``): when the cycle under way began
  (``time.monotonic()``; 0.0 between cycles), so the reactor side can tell a cycle
  that never returns (watchdog.py);
- ``io_thread`` (writer: ``IOThread``): the I/O thread's id, for the watchdog's stack dump;
- ``browser_held`` (writer: ``IOThread``): browser leases it holds, counted against
  STREAMS_BROWSER_MAX (for the metrics).

Both threads:

- ``starved``: the reactor sets it when it found nothing to hand out; the I/O thread
  clears it and calls ``wake`` when requests arrive (it appends the arrivals first);
- ``kicked``: an Event; ``kick()`` (either side) wakes the I/O thread.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request

    from streams_sched.frontier.records import LeasedEntry
    from streams_sched.worker.ops import Op

__all__ = ["OUTBOX_FLUSH", "Exchange", "SiteWeights"]

#: Operations in the outbox that wake the I/O thread at once (it otherwise flushes
#: every STREAMS_FLUSH_INTERVAL_SECONDS).
OUTBOX_FLUSH = 512


def _nothing() -> None:
    return None


def _zero() -> int:
    return 0


def _effective(weight: float | None) -> float:
    """A weight as fairness uses it: none, 0 or below counts as 1 (never divide by zero)."""
    return weight if weight is not None and weight > 0 else 1.0


class SiteWeights(MutableMapping[str, float]):
    """Each site's fairness weight: written by the I/O thread, read by the scheduler, which
    also forgets the weights of sites it no longer holds.

    The I/O thread uses it as a dict (``get``, ``[site] = weight``): it writes a site's
    weight when a lease reply brings one that differs from ``get``, before it hands over
    that reply's requests. A weight of 1 (or none, or 0 and below) is not stored: with the
    default policy nothing is. Every change is queued in ``changed`` for the scheduler, which
    re-ranks the site if it has it ready.

    Forgetting must not drop a weight the I/O thread has just confirmed for requests the
    scheduler has not taken yet (it would not write it again: ``get`` returned it). So the
    scheduler forgets in two steps around taking in the arrivals: :meth:`begin_forget` marks
    the sites, leaving out the one the I/O thread looked at last (it may be between reading
    its weight and handing over its requests); :meth:`end_forget` drops the weights of the
    marked sites still gone, unless the I/O thread looked at them in between. Both steps
    and every I/O-thread access take a lock, so a look and a drop never interleave.
    """

    __slots__ = ("_leaving", "_lock", "_touched", "_w", "changed")

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._w: dict[str, float] = {}
        self._lock = threading.Lock()
        #: the site the I/O thread looked at last
        self._touched: str | None = None
        #: sites marked by begin_forget and not looked at since
        self._leaving: set[str] = set()
        #: sites whose effective weight changed, oldest first (the I/O thread appends)
        self.changed: deque[str] = deque()
        for site, weight in (weights or {}).items():
            if _effective(weight) != 1.0:
                self._w[site] = weight

    # -- the I/O thread's side: a dict

    def __getitem__(self, site: str) -> float:
        with self._lock:
            self._touched = site
            self._leaving.discard(site)
            return self._w[site]

    def get(self, site: str, default: Any = None) -> Any:
        with self._lock:
            self._touched = site
            self._leaving.discard(site)
            return self._w.get(site, default)

    def __contains__(self, site: object) -> bool:
        return isinstance(site, str) and self.get(site) is not None

    def __setitem__(self, site: str, weight: float) -> None:
        new = _effective(weight)
        with self._lock:
            self._touched = site
            self._leaving.discard(site)
            old = _effective(self._w.get(site))
            if new != 1.0:
                self._w[site] = new
            else:
                self._w.pop(site, None)
        if new != old:
            self.changed.append(site)

    def __delitem__(self, site: str) -> None:
        with self._lock:
            self._touched = site
            self._leaving.discard(site)
            old = self._w.pop(site)
        if _effective(old) != 1.0:
            self.changed.append(site)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._w))

    def __len__(self) -> int:
        return len(self._w)

    def __repr__(self) -> str:
        return f"SiteWeights({self._w!r})"

    # -- the scheduler's side

    def weight(self, site: str) -> float:
        """The weight fairness uses for ``site`` (1 when none is stored)."""
        return self._w.get(site, 1.0)

    def holds(self, site: str) -> bool:
        """Whether a weight is stored for ``site`` (without counting as a look by the I/O thread)."""
        return site in self._w

    def begin_forget(self, sites: Iterable[str]) -> list[str]:
        """Mark ``sites`` to be forgotten; return the marked ones. The site the I/O thread
        looked at last is left out: ask again later."""
        with self._lock:
            touched = self._touched
            marked = [s for s in sites if s != touched]
            self._leaving.update(marked)
        return marked

    def end_forget(self, marked: Iterable[str], gone: Callable[[str], bool]) -> list[str]:
        """After taking in the arrivals: drop the weights of the ``marked`` sites that are
        still ``gone``; return those still gone that the I/O thread looked at since they
        were marked (ask again later)."""
        again = []
        with self._lock:
            leaving = self._leaving
            w = self._w
            for site in marked:
                if site in leaving:
                    leaving.discard(site)
                    if gone(site):
                        w.pop(site, None)
                elif gone(site):
                    again.append(site)
        return again


@dataclass(slots=True, eq=False)
class Exchange:
    """Queues and flags between the reactor thread and the I/O thread (see the module)."""

    # One flat object on purpose: each field is one attribute read on a hot path of
    # either thread (a nested group would add a lookup to each).

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
    renders: int = 0
    render_s: float = 0.0
    # -- I/O thread -> reactor
    arrivals: deque[tuple[Request, LeasedEntry]] = field(default_factory=deque)
    stats: deque[tuple[str, int]] = field(default_factory=deque)
    weights: SiteWeights = field(default_factory=SiteWeights)
    drained: bool = False
    #: enqueue operations whose reply came back; until it matches what the scheduler
    #: queued, the crawl is not drained even if Redis looked so
    enqueues_done: int = 0
    #: operations taken from the outbox but not yet confirmed by Redis
    unsent: bool = False
    legacy: str | None = None
    seen_epoch: int = 0
    fatal: BaseException | None = None
    moved: str | None = None
    unreachable_since: float | None = None
    cycle_started: float = 0.0
    io_thread: int | None = None
    #: browser leases held (prefetched or rendering), as of the I/O thread's last cycle
    browser_held: int = 0
    #: the reactor sets it when it found nothing to hand out; the I/O thread clears it
    #: and calls ``wake`` when requests arrive (it appends the arrivals first)
    starved: bool = True
    wake: Callable[[], None] = _nothing
    kicked: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        if not isinstance(self.weights, SiteWeights):  # Exchange(weights={...})
            self.weights = SiteWeights(self.weights)

    def kick(self) -> None:
        """Wake the I/O thread now."""
        self.kicked.set()

    def wake_if_starved(self) -> None:
        """I/O thread: new requests arrived; wake the engine only if it found nothing the
        last time it asked (a busy engine asks again by itself after each download, and
        every wake costs the reactor a self-pipe wake-up and the GIL)."""
        if self.starved:
            self.starved = False
            self.wake()

    def put(self, op: Op) -> None:
        """Queue ``op`` for the I/O thread (in order)."""
        outbox = self.outbox
        outbox.append(op)
        if len(outbox) >= OUTBOX_FLUSH:
            self.kicked.set()

    def weight(self, site: str) -> float:
        """The fairness weight of ``site`` (reactor side: 1 unless its policy says otherwise)."""
        return self.weights.weight(site)

    def may_be_busy(self) -> bool:
        """Operations the I/O thread has not finished (seen from the reactor)."""
        return bool(self.outbox) or self.unsent
