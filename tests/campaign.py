"""A seeded random fault campaign: one crawl, several faults drawn from a seed, and the
invariants checked after it. ``tests/test_campaign.py`` runs a few fixed seeds;
``python -m bench faults`` (bench/faults.py) runs seed after seed for a given time and
tabulates what each kind of fault cost.

A run is a crawl of the synthetic web by two workers (replacements join as workers are
stopped) on one of two set-ups:

- ``cluster``: a Redis Cluster of 3 masters with one replica each (AOF on,
  ``cluster-node-timeout`` 1500 ms); REDIS_URL names node 0 (through a proxy), then
  nodes 1 and 2;
- ``sentinel``: a primary with two replicas (AOF on) under three sentinels
  (``down-after-milliseconds`` 1000); REDIS_URL names the sentinels, the first through
  a proxy.

The schedule depends on the seed and the set-up alone (:func:`draw_schedule`): when
each fault fires is a share of the crawl's pages, not a time. A fault names its target
by role (the node REDIS_URL names first, the master of shard 1, a replica, the second
live worker), resolved when it fires. The faults: SIGKILL of a node, left down or
restarted with its data or empty; SIGSTOP of a node past the failover timeout, then
SIGCONT; ``maxmemory`` put below the memory in use (noeviction), at start or mid-crawl,
then lifted; the proxy cutting connections right after forwarding a command; SIGKILL
and SIGTERM of a worker (a replacement starts); a worker whose clock is off joining
(tests/skewed_clock/sitecustomize.py shifts its ``time.time()``). The schedule stays
within what the set-up survives: at most one node down or stopped at a time, no shard (or Sentinel
data set) hit again while it has no replica in sync, at most one sentinel down.

The invariants (:meth:`RunResult.failures`): every page crawled; every worker not
SIGKILLed exits 0 by itself; no traceback in any worker's log; nothing left in Redis
(backlog, leases, delayed requests, dead letters); no stall (no new page for
:data:`STALL_S` while one is due).

With ``tracked`` (continuous crawling), one page in :data:`TRACK_ONE_IN` is tracked
(tests/spiders.py TrackedSpider), back every :data:`TRACK_EVERY_S`, so pages are revisited
through the faults. Once every page was crawled, each tracked page must be in the
frontier exactly once (waiting in its site's delayed ZSET, or queued in a stream), none
lost and none scheduled twice; then the crawl's tracking is stopped
(``streams-sched revisits --stop``) and it drains as any other. Pages crawled twice count
first visits only. Pages crawled twice are measured against the bound of
:meth:`RunResult.twice_bound` and reported, not failed: a failover may legitimately
repeat the dead master's last moments. So are a site's counters that do not balance
(enqueued against acked + dead) with nothing left: they are statistics.

A failing run prints its seed, its set-up and its schedule; the same seed replays it:
``STREAMS_CAMPAIGN_SEED=SEED STREAMS_CAMPAIGN_SETUP=SETUP pytest tests/test_campaign.py``.
"""

from __future__ import annotations

import bisect
import json
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis_tools import LocalCluster, LocalSentinel, TcpProxy

from streams_sched.demo.web import SyntheticWeb
from streams_sched.testing import RedisServer

from helpers import Worker, base_settings, frontier, tracked_once_problems, wait_for
from spiders import tracked_page

__all__ = ["SETUPS", "Fault", "RunResult", "draw_schedule", "replay_command", "run_campaign"]

SETUPS = ("cluster", "sentinel")

#: the crawl: sites x pages of the synthetic web, two workers
SITES, PAGES = 8, 500
CONCURRENT_REQUESTS = 8
WORKERS = 2
#: settings every worker of a run gets (beside base_settings')
CRAWL_SETTINGS: dict[str, Any] = {
    "SYNTH_SITES": SITES,
    "SYNTH_PAGES": PAGES,
    "SYNTH_DELAY_SECONDS": 0.03,
    "STREAMS_LEASE_SECONDS": 8,
    "STREAMS_SOCKET_TIMEOUT_SECONDS": 2,
    "STREAMS_CONNECT_TIMEOUT_SECONDS": 60,
    "CONCURRENT_REQUESTS": CONCURRENT_REQUESTS,
    "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
}
#: with tracked pages: one page in TRACK_ONE_IN is tracked, back every TRACK_EVERY_S
TRACK_ONE_IN, TRACK_EVERY_S = 20, 4.0
TRACKED_SPIDER = "spiders.TrackedSpider"
#: no new page for this long while pages are due: the run has stalled
STALL_S = 90.0
#: how long the workers get to finish by themselves after the last fault
FINISH_S = 180.0
#: how long a fault waits for its target to be safe to hit (a replica in sync) before it is skipped
READY_S = 90.0
#: the line a worker logs once it has opened (its scheduler is up, its signal handlers set)
OPENED = " opened: crawl="
#: a fault whose crawl rate has not fallen by half within this long did not slow the crawl
FALL_WITHIN_S = 5.0

CLUSTER_NODE_TIMEOUT_MS = 1500
SENTINEL_DOWN_AFTER_MS = 1000
#: a slot of each shard of the cluster (redis-cli gives masters 0, 1, 2 these ranges, in order)
SHARD_SLOTS = (0, 5461, 10923)

# -- the schedule ---------------------------------------------------------------------------

#: kinds of fault and how often each is drawn
KIND_WEIGHTS = {
    "kill-node": 5,
    "stop-node": 2,
    "oom": 2,
    "proxy-cut": 1,
    "kill-worker": 2,
    "term-worker": 1,
    "skew-worker": 1,
}
NODE_KINDS = ("kill-node", "stop-node")


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule. ``at``: the share of the crawl's pages crawled when it fires
    (0: before the first worker starts). ``target``: what it hits, by role, resolved when it
    fires: ``url`` (the node REDIS_URL names first: node 0 of the cluster, the first
    sentinel), ``master:K`` / ``replica:K`` (shard K of the cluster), ``primary``,
    ``replica:K`` (the K-th live replica under Sentinel), ``sentinel:I``, ``masters`` (every
    master), ``worker:K`` (the K-th live worker by name). ``with_next``: the next fault
    fires while this one is still on (before its restart, SIGCONT or lift)."""

    kind: str
    at: float
    target: str = ""
    then: str = ""  # kill-node: "down", "restart" (with its data) or "restart-empty"
    hold_s: float = 0.0  # stop-node, oom: how long the fault lasts
    lag_s: float = 0.0  # kill-node of a master: its replicas miss this much of its writes first
    skew_s: float = 0.0  # skew-worker
    with_next: bool = False

    def label(self) -> str:
        """The row of the bench table this fault counts in."""
        if self.kind == "kill-node":
            return f"kill {self._role()}, {self.then.replace('-', ' ')}"
        if self.kind == "stop-node":
            return f"stop {self._role()}"
        if self.kind == "oom":
            return "oom at start" if self.at == 0 else "oom mid-crawl"
        return self.kind.replace("-", " ")

    def _role(self) -> str:
        if self.target == "url":
            return "url node"
        return self.target.split(":")[0]

    def describe(self) -> str:
        when = "at start" if self.at == 0 else f"after {self.at:.0%} of pages"
        target = "the node REDIS_URL names first" if self.target == "url" else self.target
        what = {
            "kill-node": f"SIGKILL {target}" + (f" (if a master, its replicas {self.lag_s:.1f}s behind)" if self.lag_s else "")
            + {"down": ", left down", "restart": ", restarted with its data", "restart-empty": ", restarted empty"}.get(self.then, ""),
            "stop-node": f"SIGSTOP {target} for {self.hold_s:.1f}s, then SIGCONT",
            "oom": f"maxmemory below used memory on {self.target} for {self.hold_s:.1f}s, then lifted",
            "proxy-cut": "the proxy in front of the URL's first node cuts the next 2 connections after a command",
            "kill-worker": f"SIGKILL {self.target}, a replacement starts",
            "term-worker": f"SIGTERM {self.target}, a replacement starts once it exits",
            "skew-worker": f"a worker with its clock {self.skew_s:+.0f}s off joins",
        }[self.kind]
        return f"{when}: {what}" + ("; the next fault comes while this one is on" if self.with_next else "")


def draw_schedule(seed: int, setup: str) -> list[Fault]:
    """The faults of run ``seed`` on ``setup``: a function of the two alone."""
    if setup not in SETUPS:
        raise ValueError(f"unknown set-up {setup!r}; expected one of {SETUPS}")
    rng = random.Random(f"{setup}/{seed}")
    count = rng.randint(3, 5)
    ats = sorted(round(rng.uniform(0.08, 0.75), 2) for _ in range(count))
    model = _ClusterModel() if setup == "cluster" else _SentinelModel()
    kinds, weights = list(KIND_WEIGHTS), list(KIND_WEIGHTS.values())
    faults: list[Fault] = []
    for i, at in enumerate(ats):
        kind = rng.choices(kinds, weights)[0]
        if i == 0 and kind == "oom" and rng.random() < 0.4:
            at = 0.0  # maxmemory already reached when the crawl starts
        fault = _draw_fault(rng, kind, at, model)
        if fault is None:  # nothing of that kind can be hit safely any more
            fault = Fault("kill-worker", at, f"worker:{rng.randrange(WORKERS)}")
        faults.append(fault)
    # overlaps: a fault held on while the next fires, never two node faults at once
    out: list[Fault] = []
    for i, fault in enumerate(faults):
        nxt = faults[i + 1] if i + 1 < len(faults) else None
        overlap = (
            nxt is not None and fault.at > 0 and not (out and out[-1].with_next)  # pairs, never chains
            and not (fault.kind in NODE_KINDS and nxt.kind in NODE_KINDS)
            and rng.random() < 0.3
        )
        out.append(Fault(**{**asdict(fault), "with_next": overlap}))
    return out


class _ClusterModel:
    """What the schedule has left down for good: no shard is hit again once it lost a node."""

    def __init__(self) -> None:
        self.degraded: set[int] = set()

    def node_targets(self) -> list[str]:
        ok = [k for k in range(len(SHARD_SLOTS)) if k not in self.degraded]
        return (["url"] if 0 in ok else []) + [f"master:{k}" for k in ok] + [f"replica:{k}" for k in ok]

    def left_down(self, target: str) -> None:
        self.degraded.add(0 if target == "url" else int(target.split(":")[1]))

    def oom_targets(self) -> list[str]:
        return ["masters", *(f"master:{k}" for k in range(len(SHARD_SLOTS)))]

    restarts = ("down", "restart", "restart-empty")


class _SentinelModel:
    """At most one data node and one sentinel left down for good."""

    def __init__(self) -> None:
        self.data_down = False
        self.sentinel_down = False

    def node_targets(self) -> list[str]:
        data = ["primary", "replica:0", "replica:1"]
        sentinels = [] if self.sentinel_down else ["url", "sentinel:1", "sentinel:2"]
        return data + sentinels

    def left_down(self, target: str) -> None:
        if target in ("url",) or target.startswith("sentinel"):
            self.sentinel_down = True
        else:
            self.data_down = True

    def oom_targets(self) -> list[str]:
        return ["primary"]

    restarts = ("down", "restart", "restart-empty")


def _draw_fault(rng: random.Random, kind: str, at: float, model: Any) -> Fault | None:
    if kind in NODE_KINDS:
        targets = model.node_targets()
        if not targets:
            return None
        target = rng.choice(targets)
        if kind == "stop-node":
            timeout_s = (CLUSTER_NODE_TIMEOUT_MS if isinstance(model, _ClusterModel) else SENTINEL_DOWN_AFTER_MS) / 1000
            return Fault(kind, at, target, hold_s=round(rng.uniform(1.5, 3.0) * timeout_s, 1))
        sentinel_node = isinstance(model, _SentinelModel) and (target == "url" or target.startswith("sentinel"))
        then = rng.choice(("down", "restart") if sentinel_node else model.restarts)
        if then == "down" and isinstance(model, _SentinelModel) and not sentinel_node and model.data_down:
            then = "restart"
        if then == "down":
            model.left_down(target)
        # a master's replicas may miss its last writes (the url node of a cluster is a master or a replica)
        may_lead = target in ("primary", "url") or target.startswith("master") if not sentinel_node else False
        lag = rng.choice((0.0, 0.5)) if may_lead else 0.0
        return Fault(kind, at, target, then=then, lag_s=lag)
    if kind == "oom":
        return Fault(kind, at, rng.choice(model.oom_targets()), hold_s=round(rng.uniform(2.0, 6.0), 1))
    if kind == "proxy-cut":
        return Fault(kind, at, "url")
    if kind == "skew-worker":
        return Fault(kind, at, skew_s=rng.choice((-120.0, -20.0, -5.0, 5.0, 20.0, 120.0)))
    return Fault(kind, at, f"worker:{rng.randrange(WORKERS)}")


def replay_command(setup: str, seed: int, tracked: bool = False) -> str:
    tracked_env = " STREAMS_CAMPAIGN_TRACKED=1" if tracked else ""
    return (f"STREAMS_CAMPAIGN_SEED={seed} STREAMS_CAMPAIGN_SETUP={setup}{tracked_env}"
            " .venv/bin/python -m pytest tests/test_campaign.py")


# -- what happened ----------------------------------------------------------------------------


@dataclass
class Fired:
    """A fault as it ran: when (monotonic), at how many pages, what it hit, what came of it."""

    fault: Fault
    t: float = 0.0
    pages: int = 0
    workers: int = 0
    #: pages crawled in the second before it
    rate: int = 0
    hit: str = ""
    note: str = ""
    skipped: str = ""
    recover_s: float | None = None
    #: pages crawled twice whose repeat came after this fault and before the next
    twice: int = 0


@dataclass
class RunResult:
    setup: str
    seed: int
    schedule: list[Fault]
    fired: list[Fired] = field(default_factory=list)
    total: int = SITES * PAGES
    crawled: int = 0
    missing: list[str] = field(default_factory=list)
    twice: int = 0
    exits: dict[str, int | str] = field(default_factory=dict)
    tracebacks: dict[str, str] = field(default_factory=dict)
    #: the loss ERRORs the workers logged, per worker (docs/concepts/faults.md, word for word)
    loss_errors: dict[str, list[str]] = field(default_factory=dict)
    leftovers: list[str] = field(default_factory=list)
    #: sites whose counters do not balance though nothing is left: reported, not failed (the
    #: counters are statistics; the pages and the leftovers are what the invariants hold to)
    counters_off: list[str] = field(default_factory=list)
    stall: str = ""
    error: str = ""
    elapsed_s: float = 0.0
    longest_gap_s: float = 0.0
    #: a run with tracked pages: revisits crawled, and what was wrong with the tracked pages
    #: in the frontier once every page was crawled (lost, or there twice)
    tracked: bool = False
    revisits: int = 0
    tracked_problems: list[str] = field(default_factory=list)

    def false_loss_errors(self) -> list[str]:
        """Loss ERRORs that no fault of the run could have caused: every node keeps an AOF, so
        only a node restarted empty can lose its data, and only a node killed or stopped can
        be replaced by a replica that lacks writes. Such a line would be a false alarm."""
        ran = {f.fault.kind + ":" + f.fault.then for f in self.fired if not f.skipped}
        emptied = any(k.endswith(":restart-empty") for k in ran)
        replaced = any(k.split(":")[0] in ("kill-node", "stop-node") for k in ran)
        out = []
        for w, lines in self.loss_errors.items():
            for line in lines:
                if ("restarted empty" in line and not emptied) or ("was promoted without" in line and not replaced):
                    out.append(f"a loss ERROR in {w}'s log that no fault of this run explains: {line[:400]}")
        return out

    def twice_bound(self) -> int:
        """Pages a run may crawl twice: for each kill or stop, the pages in flight then
        (CONCURRENT_REQUESTS per live worker) plus one second of the crawl's rate."""
        return sum(f.workers * CONCURRENT_REQUESTS + f.rate for f in self.fired
                   if not f.skipped and f.fault.kind in ("kill-node", "stop-node", "kill-worker"))

    def failures(self) -> list[str]:
        out = []
        if self.error:
            out.append(f"error: {self.error}")
        if self.stall:
            out.append(f"stalled: {self.stall}")
        if self.missing:
            out.append(f"{len(self.missing)} pages never crawled, e.g. {sorted(self.missing)[:5]}")
        bad = {w: c for w, c in self.exits.items() if c != 0 and c != "killed"}
        if bad:
            out.append(f"workers did not exit 0: {bad}")
        for w, line in self.tracebacks.items():
            out.append(f"traceback in {w}'s log: {line}")
        out.extend(self.false_loss_errors())
        if self.leftovers:
            out.append(f"left in Redis: {self.leftovers[:8]}")
        out.extend(self.tracked_problems)
        return out

    def summary(self) -> str:
        return (f"{self.setup} seed={self.seed}{' tracked' if self.tracked else ''}:"
                f" {len([f for f in self.fired if not f.skipped])}/{len(self.schedule)} faults"
                f" fired, crawled {self.crawled}/{self.total}, never crawled {len(self.missing)}, crawled twice"
                f" {self.twice} (bound {self.twice_bound()})"
                + (f", counters off on {len(self.counters_off)} sites" if self.counters_off else "")
                + (f", {self.revisits} revisits" if self.tracked else "")
                + f", longest gap {self.longest_gap_s:.1f}s,"
                f" in {self.elapsed_s:.0f}s" + ("" if not self.failures() else " FAILED"))

    def report(self) -> str:
        """The seed, the schedule as it ran, the failures and how to replay."""
        lines = [f"campaign {self.summary()}", "schedule:"]
        for i, fault in enumerate(self.schedule):
            lines.append(f"  {i + 1}. {fault.describe()}")
            done = next((f for f in self.fired if f.fault is fault), None)
            if done is not None:
                state = f"skipped: {done.skipped}" if done.skipped else (
                    f"fired at {done.pages} pages on {done.hit}, {done.workers} workers, {done.rate} pages/s;"
                    f" rate back after {_secs(done.recover_s)}; {done.twice} repeats after it"
                    + (f"; {done.note}" if done.note else ""))
                lines.append(f"     {state}")
        if self.counters_off:
            lines.append(f"counters that do not balance (reported, not failed): {self.counters_off[:8]}")
        for problem in self.failures():
            lines.append(f"FAILED: {problem}")
        lines.append(f"replay: {replay_command(self.setup, self.seed, self.tracked)}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "setup": self.setup, "seed": self.seed, "schedule": [asdict(f) for f in self.schedule],
            "fired": [{**asdict(f), "fault": asdict(f.fault), "label": f.fault.label()} for f in self.fired],
            "total": self.total, "crawled": self.crawled, "missing": len(self.missing), "twice": self.twice,
            "twice_bound": self.twice_bound(), "exits": self.exits, "tracebacks": self.tracebacks, "loss_errors": self.loss_errors,
            "leftovers": self.leftovers, "counters_off": self.counters_off, "stall": self.stall, "error": self.error, "elapsed_s": self.elapsed_s,
            "longest_gap_s": self.longest_gap_s, "failures": self.failures(),
            "tracked": self.tracked, "revisits": self.revisits, "tracked_problems": self.tracked_problems,
        }


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


# -- following the crawl ---------------------------------------------------------------------


class Progress:
    """Tails the items file on a thread: each page's URL and when it arrived (monotonic),
    so rates and gaps do not depend on the workers' clocks (one of them may be off).
    Revisits of tracked pages are counted apart, not as arrivals."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: (when it arrived, its URL, the worker that crawled it)
        self.arrivals: list[tuple[float, str, str]] = []
        self.urls: set[str] = set()
        self.revisits = 0
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, daemon=True, name="campaign-progress")
        self._thread.start()

    def _tail(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(0.05)

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        now = time.monotonic()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            if line.strip():
                item = json.loads(line)
                if item.get("revisit"):
                    self.revisits += 1
                    continue
                self.arrivals.append((now, item["url"], item.get("worker", "")))
                self.urls.add(item["url"])

    def count(self) -> int:
        return len(self.arrivals)

    def in_window(self, start: float, end: float) -> int:
        return sum(1 for t, _, _ in self.arrivals if start <= t < end)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._read()


class Stalled(Exception):
    """Raised when no page arrives for STALL_S while the campaign waits for one."""


# -- the set-ups ----------------------------------------------------------------------------


def _alive(node: RedisServer) -> bool:
    return node.proc is not None and node.proc.poll() is None


def _client(node: RedisServer) -> redis.Redis:
    return redis.Redis(port=node.port, socket_timeout=2, socket_connect_timeout=1, decode_responses=True)


def _ask(node: RedisServer, *command: Any) -> Any:
    """``command`` on ``node``, or None if it does not answer."""
    client = _client(node)
    try:
        return client.execute_command(*command)
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return None
    finally:
        client.close()


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """wait_for, raising TimeoutError: a condition the campaign waits on that never comes is a stall."""
    return wait_for(condition, timeout, 0.1, what, error=TimeoutError)


class ClusterSetup:
    """3 masters with one replica each; REDIS_URL names node 0 through the proxy, then nodes 1 and 2."""

    name = "cluster"

    def __init__(self) -> None:
        self.cluster = LocalCluster(3, replicas=1, node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS, appendonly=True)
        self.proxy: TcpProxy | None = None

    def start(self) -> None:
        self.cluster.start()
        self.proxy = TcpProxy(self.cluster.nodes[0].port)

    @property
    def url(self) -> str:
        assert self.proxy is not None
        named = [f"127.0.0.1:{self.proxy.port}", *(f"127.0.0.1:{n.port}" for n in self.cluster.nodes[1:3])]
        return "redis://" + ",".join(named) + "/0?cluster=1"

    def check_url(self) -> str:
        """A URL naming every live node, for the checks after the crawl."""
        return self.cluster.url_naming([n for n in self.cluster.nodes if _alive(n)])

    def data_nodes(self) -> list[RedisServer]:
        return self.cluster.nodes

    def _shards(self) -> list[tuple[int, int, int, list[int]]]:
        """(first slot, last slot, master port, replica ports) of each slot range, from a live node."""
        for node in self.cluster.nodes:
            if not _alive(node):
                continue
            reply = _ask(node, "CLUSTER", "SLOTS")
            if reply:
                return [(int(r[0]), int(r[1]), int(r[2][1]), [int(x[1]) for x in r[3:]]) for r in reply]
        raise RuntimeError("no cluster node answers CLUSTER SLOTS")

    def _node(self, port: int) -> RedisServer:
        return next(n for n in self.cluster.nodes if n.port == port)

    def resolve(self, target: str) -> RedisServer | None:
        if target == "url":
            return self.cluster.nodes[0]
        role, k = target.split(":")
        slot = SHARD_SLOTS[int(k)]
        for first, last, master, replicas in self._shards():
            if first <= slot <= last:
                if role == "master":
                    return self._node(master)
                live = [self._node(p) for p in replicas if _alive(self._node(p))]
                return live[0] if live else None
        return None

    def masters(self) -> list[RedisServer]:
        return [self._node(master) for _, _, master, _ in self._shards()]

    def is_master(self, node: RedisServer) -> bool:
        return self.cluster.role(node) == "master"

    def ready_to_hit(self, node: RedisServer) -> bool:
        """Every live node says cluster_state:ok, none is stopped, and a master has a replica in sync."""
        live = [n for n in self.cluster.nodes if _alive(n)]
        if not all("cluster_state:ok" in str(_ask(n, "CLUSTER", "INFO")) for n in live):
            return False
        if not _alive(node):
            return False
        if self.is_master(node):
            try:
                return self.cluster.has_replica(node)
            except (redis.ConnectionError, redis.TimeoutError):
                return False
        return True

    def kill(self, node: RedisServer, lag_s: float) -> Callable[[], str] | None:
        """SIGKILL ``node``; for a master, returns the wait for its failover (saying who was promoted)."""
        if not self.is_master(node):
            node.kill()
            return None
        self.cluster.kill(node, lag_s=lag_s)
        return lambda: f"127.0.0.1:{self.cluster.wait_failover(node).port} promoted"

    def restart(self, node: RedisServer, empty: bool) -> None:
        self.cluster.restart(node, empty=empty)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.cluster.cleanup()


class SentinelSetup:
    """A primary and two replicas under three sentinels; REDIS_URL names the sentinels, the first through the proxy."""

    name = "sentinel"

    def __init__(self) -> None:
        self.sentinel = LocalSentinel(replicas=2, appendonly=True, down_after_ms=SENTINEL_DOWN_AFTER_MS)
        self.proxy: TcpProxy | None = None

    def start(self) -> None:
        self.sentinel.start()
        self.proxy = TcpProxy(self.sentinel.sentinels[0].port)

    @property
    def url(self) -> str:
        assert self.proxy is not None
        named = [f"127.0.0.1:{self.proxy.port}", *(f"127.0.0.1:{s.port}" for s in self.sentinel.sentinels[1:])]
        return f"redis+sentinel://{','.join(named)}/{self.sentinel.service}/0"

    def check_url(self) -> str:
        return self.sentinel.url

    def data_nodes(self) -> list[RedisServer]:
        return self.sentinel.nodes

    def _master_port(self) -> int | None:
        """The master the live sentinels agree on, if they do."""
        ports = set(self.sentinel.reported_master_ports())  # the running sentinels'
        return ports.pop() if len(ports) == 1 and None not in ports else None

    def resolve(self, target: str) -> RedisServer | None:
        if target == "url":
            return self.sentinel.sentinels[0]
        if target.startswith("sentinel:"):
            return self.sentinel.sentinels[int(target.split(":")[1])]
        port = self._master_port()
        if port is None:
            return None
        if target == "primary":
            return self.sentinel.node_on(port)
        live = [n for n in self.sentinel.nodes if n.port != port and _alive(n)]
        return live[int(target.split(":")[1]) % len(live)] if live else None

    def masters(self) -> list[RedisServer]:
        port = self._master_port()
        return [self.sentinel.node_on(port)] if port is not None else []

    def is_master(self, node: RedisServer) -> bool:
        return node in self.sentinel.nodes and self._master_port() == node.port

    def ready_to_hit(self, node: RedisServer) -> bool:
        """The live sentinels agree on a master that says so and has a replica online."""
        if not _alive(node):
            return False
        port = self._master_port()
        if port is None:
            return False
        master = self.sentinel.node_on(port)
        info = _ask(master, "INFO", "replication")
        if not isinstance(info, dict) or info.get("role") != "master":
            return False
        online = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit() and v.get("state") == "online"]
        return len(online) >= 1

    def kill(self, node: RedisServer, lag_s: float) -> Callable[[], str] | None:
        """SIGKILL ``node``; for the primary, returns the wait for its failover (saying who was promoted)."""
        if node in self.sentinel.sentinels or not self.is_master(node):
            node.kill()
            return None
        replicas = [n for n in self.sentinel.nodes if n is not node and _alive(n)]
        if lag_s > 0:
            for r in replicas:
                r.pause()
            _ask(node, "CLIENT", "KILL", "TYPE", "replica")
            time.sleep(lag_s)
        node.kill()
        for r in replicas:
            r.resume()
        old = node.port

        def failover() -> str:
            new = _wait(lambda: (p := self._master_port()) is not None and p != old and p, 60, f"a failover away from {old}")
            return f"127.0.0.1:{new} promoted"

        return failover

    def restart(self, node: RedisServer, empty: bool) -> None:
        if node in self.sentinel.sentinels:
            node.start()
        else:
            self.sentinel.restart(node, empty=empty)

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        self.sentinel.cleanup()


# -- a run -----------------------------------------------------------------------------------


class Campaign:
    """One run: the set-up, the workers, the faults in schedule order, then the checks."""

    def __init__(
        self, setup: str, seed: int, workdir: Path, say: Callable[[str], None] | None = None, tracked: bool = False,
    ) -> None:
        self.setup_name = setup
        self.tracked = tracked
        self.seed = seed
        self.schedule = draw_schedule(seed, setup)
        self.dir = workdir
        self.say = say or (lambda _: None)
        self.items = workdir / "items.jsonl"
        self.result = RunResult(setup, seed, self.schedule, tracked=tracked)
        self.workers: dict[str, Worker] = {}
        self.exits: dict[str, int | str] = {}
        self.serial = 0
        self.rng = random.Random(f"{setup}/{seed}/run")
        self.setup: Any = None
        self.progress: Progress | None = None
        self.settings: dict[str, Any] = {}
        self.notes_at_end: list[Callable[[], None]] = []
        self.pending_undo: Callable[[], None] | None = None

    # -- workers --

    def start_worker(self, *, seed: bool = False, clock_skew_s: float = 0.0) -> str:
        self.serial += 1
        node = f"w{self.serial}"
        settings = {**self.settings, "SYNTH_SEED": seed, "STREAMS_NODE_ID": node, "RECORD_TAG": node}
        spider = TRACKED_SPIDER if self.tracked else "streams_sched.demo.spider.SyntheticSpider"
        self.workers[node] = Worker(settings, self.dir / f"{node}.log", spider=spider, clock_skew_s=clock_skew_s)
        return node

    def live_workers(self) -> list[str]:
        return sorted((n for n, w in self.workers.items() if w.alive()), key=lambda n: int(n[1:]))

    # -- waiting --

    def wait_pages(self, pages: int, distinct: bool = False) -> bool:
        """Until ``pages`` items arrived (``distinct``: ``pages`` URLs); False if the crawl ended
        first. Raises Stalled."""
        assert self.progress is not None
        last_count, last_change = -1, time.monotonic()
        while True:
            if not self.live_workers():
                return False
            if (len(self.progress.urls) if distinct else self.progress.count()) >= pages:
                return True
            count = self.progress.count()
            if count != last_count:
                last_count, last_change = count, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                raise Stalled(f"no page for {STALL_S:.0f}s at {count} pages while waiting for {pages}")
            time.sleep(0.05)

    # -- faults --

    def fire(self, fault: Fault) -> Fired:
        """Inject ``fault``; returns its record. What ends the fault (a restart, SIGCONT, the
        lift of maxmemory) is left in ``pending_undo``, for after the next fault if it comes with it."""
        fired = self._mark(Fired(fault))
        self.result.fired.append(fired)
        self.pending_undo = None
        try:
            getattr(self, "_" + fault.kind.replace("-", "_"))(fault, fired)
        except TimeoutError as exc:
            fired.skipped = fired.skipped or f"not safe to hit: {exc}"
        self.say(f"[{self.setup_name} {self.seed}] {fault.describe()}: "
                 + (f"skipped ({fired.skipped})" if fired.skipped else f"on {fired.hit} at {fired.pages} pages"))
        return fired

    def _mark(self, fired: Fired) -> Fired:
        """Note the moment of the fault: when, at how many pages, how many workers, the last second's pages."""
        assert self.progress is not None
        fired.t = time.monotonic()
        fired.pages = self.progress.count()
        fired.workers = len(self.live_workers())
        fired.rate = self.progress.in_window(fired.t - 1, fired.t)
        return fired

    def _target_node(self, fault: Fault, fired: Fired) -> RedisServer | None:
        """The node ``fault`` names, once it is safe to hit (or None, with the reason in ``fired``)."""
        deadline = time.monotonic() + READY_S
        while True:
            node = self.setup.resolve(fault.target)
            if node is not None and _alive(node) and self.setup.ready_to_hit(node):
                return node
            if time.monotonic() > deadline:
                fired.skipped = f"{fault.target} not safe to hit within {READY_S:.0f}s"
                return None
            time.sleep(0.2)

    def _kill_node(self, fault: Fault, fired: Fired) -> None:
        node = self._target_node(fault, fired)
        if node is None:
            return
        fired.hit = f"{fault.target} 127.0.0.1:{node.port}" + (" (a master)" if self.setup.is_master(node) else "")
        self._mark(fired)
        failover = self.setup.kill(node, fault.lag_s)

        def undo() -> None:
            if failover is not None:
                fired.note = failover()
            if fault.then != "down":
                self.setup.restart(node, empty=fault.then == "restart-empty")

        self.pending_undo = undo

    def _stop_node(self, fault: Fault, fired: Fired) -> None:
        node = self._target_node(fault, fired)
        if node is None:
            return
        fired.hit = f"{fault.target} 127.0.0.1:{node.port}" + (" (a master)" if self.setup.is_master(node) else "")
        self._mark(fired)
        node.pause()
        until = time.monotonic() + fault.hold_s

        def resume() -> None:
            time.sleep(max(0.0, until - time.monotonic()))
            node.resume()

        self.pending_undo = resume

    def _oom(self, fault: Fault, fired: Fired) -> None:
        if fault.target in ("masters", "primary"):
            nodes = self.setup.masters()
        else:
            node = self.setup.resolve(fault.target)
            nodes = [node] if node is not None else []
        nodes = [n for n in nodes if _alive(n)]
        if not nodes:
            fired.skipped = f"no live {fault.target}"
            return
        refused = {n.port: oom_refusals(n) for n in nodes}
        for node in nodes:
            client = _client(node)
            try:
                used = int(client.info("memory")["used_memory"])
                client.config_set("maxmemory", max(1, used - 64 * 1024))
            finally:
                client.close()
        self._mark(fired)
        fired.hit = ", ".join(f"127.0.0.1:{n.port}" for n in nodes)

        def lift() -> None:
            # held from the first command refused (at start, the first worker takes seconds to get there)
            try:
                _wait(lambda: any(oom_refusals(n) > refused[n.port] for n in nodes), 30, "a command refused with OOM")
            except TimeoutError:
                fired.note = "no command refused with OOM within 30s"
            time.sleep(fault.hold_s)
            for node in self.setup.data_nodes():  # a replica promoted meanwhile, too
                if _alive(node):
                    _ask(node, "CONFIG", "SET", "maxmemory", "0")

        self.pending_undo = lift

    def _proxy_cut(self, fault: Fault, fired: Fired) -> None:
        proxy = self.setup.proxy
        before = proxy.cuts
        proxy.cut_after(b"", times=2)
        fired.hit = f"proxy 127.0.0.1:{proxy.port}"
        self.notes_at_end.append(lambda: setattr(fired, "note", f"{proxy.cuts - before} of 2 connections cut"))

    def _pick_worker(self, fault: Fault, fired: Fired) -> str | None:
        live = self.live_workers()
        if not live:
            fired.skipped = "no live worker"
            return None
        node = live[int(fault.target.split(":")[1]) % len(live)]
        fired.hit = node
        return node

    def _kill_worker(self, fault: Fault, fired: Fired) -> None:
        node = self._pick_worker(fault, fired)
        if node is None:
            return
        self.workers[node].kill()
        self.exits[node] = "killed"
        fired.note = f"replaced by {self.start_worker()}"

    def _term_worker(self, fault: Fault, fired: Fired) -> None:
        node = self._pick_worker(fault, fired)
        if node is None:
            return
        worker = self.workers[node]
        # a SIGTERM before Python has imported Scrapy ends the process by the signal (exit
        # -15, nothing held): the fault is a stop of a crawling worker, so wait for it to open
        try:
            _wait(lambda: OPENED in worker.log() or not worker.alive(), 60, f"{node} to open")
        except TimeoutError:
            fired.note = f"{node} had not opened after 60s; "
        self._mark(fired)
        worker.proc.send_signal(signal.SIGTERM)
        try:
            self.exits[node] = worker.proc.wait(60)
        except Exception:
            self.exits[node] = "no exit within 60s of SIGTERM"
            worker.kill()
        fired.note += f"exit {self.exits[node]}, replaced by {self.start_worker()}"

    def _skew_worker(self, fault: Fault, fired: Fired) -> None:
        fired.hit = self.start_worker(clock_skew_s=fault.skew_s)

    # -- the run --

    def run(self) -> RunResult:
        started = time.monotonic()
        self.setup = ClusterSetup() if self.setup_name == "cluster" else SentinelSetup()
        try:
            self.setup.start()
            crawl = "c" + f"{self.rng.getrandbits(40):010x}"
            self.settings = base_settings(self.setup.url, crawl, "bitmap", self.items, **CRAWL_SETTINGS,
                                          TRACK_ONE_IN=TRACK_ONE_IN, TRACK_EVERY_SECONDS=TRACK_EVERY_S)
            self.crawl = crawl
            self.progress = Progress(self.items)
            self._drive()
            if self.tracked:
                self._check_tracked()
            self._finish()
        except Stalled as exc:
            self.result.stall = str(exc)
        except Exception as exc:  # reported with the seed, not raised: the bench goes on
            self.result.error = f"{type(exc).__name__}: {exc}"
        finally:
            for w in self.workers.values():
                if w.alive() and not self.result.error:
                    self.exits.setdefault(self._name(w), "still running at the end (killed)")
                w.close()
            if self.progress is not None:
                self.progress.close()
            self.result.elapsed_s = time.monotonic() - started
            try:
                self._read_logs()
                if not self.result.error and not self.result.stall:
                    self._check_redis()
                self._measure()
            finally:
                self.setup.close()
        return self.result

    def _name(self, worker: Worker) -> str:
        return next(n for n, w in self.workers.items() if w is worker)

    def _drive(self) -> None:
        faults = list(self.schedule)
        at_start = [f for f in faults if f.at == 0]
        undo: list[Callable[[], None]] = []
        for fault in at_start:
            self.fire(fault)
            if self.pending_undo:
                undo.append(self.pending_undo)
        self.start_worker(seed=True)
        for u in undo:
            u()
        if not self.wait_pages(5):
            raise RuntimeError(f"the first worker exited before crawling 5 pages: {self.workers['w1'].log()[-2000:]}")
        for _ in range(WORKERS - 1):
            self.start_worker()
        rest = [f for f in faults if f.at > 0]
        i = 0
        while i < len(rest):
            fault = rest[i]
            if not self.wait_pages(int(fault.at * SITES * PAGES)):
                for f in rest[i:]:
                    self.result.fired.append(Fired(f, skipped="the crawl ended before it was due"))
                return
            group = [fault]
            while group[-1].with_next and i + len(group) < len(rest):
                group.append(rest[i + len(group)])
            undos = []
            for f in group:
                self.fire(f)
                if self.pending_undo:
                    undos.append(self.pending_undo)
            for u in reversed(undos):
                u()
            i += len(group)

    def _check_tracked(self) -> None:
        """Once every page was crawled: each tracked page in the frontier exactly once; then
        stop the crawl's tracking (streams-sched revisits --stop), so that it drains."""
        from streams_sched.admin.revisits import stop_tracking

        if not self.wait_pages(SITES * PAGES, distinct=True):
            return  # every worker gone: the checks after the crawl say what is missing
        want = {u for u in SyntheticWeb(sites=SITES, pages=PAGES).all_urls() if tracked_page(u, TRACK_ONE_IN)}

        def read() -> tuple[list[str]] | None:
            try:  # a node may still be failing over: read again
                return (tracked_once_problems(self.setup.check_url(), self.crawl, want),)
            except (redis.RedisError, RuntimeError):
                return None

        (self.result.tracked_problems,) = _wait(read, 60, "the tracked pages read from Redis")
        self.say(f"[{self.setup_name} {self.seed}] every page crawled; tracked pages: "
                 + ("each in the frontier once" if not self.result.tracked_problems
                    else "; ".join(self.result.tracked_problems)))
        stop_tracking(frontier(self.setup.check_url(), self.crawl))

    def _finish(self) -> None:
        deadline = time.monotonic() + FINISH_S
        for node in list(self.workers):
            worker = self.workers[node]
            if node in self.exits:
                continue
            try:
                self.exits[node] = worker.proc.wait(max(1.0, deadline - time.monotonic()))
            except Exception:
                self.exits[node] = f"no exit within {FINISH_S:.0f}s of the last fault"

    def _read_logs(self) -> None:
        for node, worker in self.workers.items():
            log = worker.log_path.read_text(errors="replace")
            if "Traceback" in log:
                at = log.index("Traceback")
                self.result.tracebacks[node] = log[at:at + 1500]
            losses = [line for line in log.splitlines()
                      if "ERROR" in line and ("restarted empty" in line or "was promoted without" in line)]
            if losses:
                self.result.loss_errors[node] = losses

    def _check_redis(self) -> None:
        try:
            self.result.leftovers, self.result.counters_off = leftovers(self.setup.check_url(), self.crawl)
            if self.tracked:  # revisits are acked without an enqueue: the counters do not balance
                self.result.counters_off = []
        except Exception as exc:
            self.result.leftovers = [f"could not read the crawl: {type(exc).__name__}: {exc}"]

    def _measure(self) -> None:
        self.result.exits = dict(self.exits)
        for note in self.notes_at_end:
            note()
        if self.progress is None:  # the set-up did not start
            return
        arrivals = self.progress.arrivals
        self.result.revisits = self.progress.revisits
        seen = Counter(url for _, url, _ in arrivals)
        self.result.crawled = len(seen)
        self.result.twice = sum(n - 1 for n in seen.values())
        if not self.result.error and not self.result.stall:
            self.result.missing = sorted(SyntheticWeb(sites=SITES, pages=PAGES).all_urls() - set(seen))
        times = [t for t, _, _ in arrivals]
        self.result.longest_gap_s = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)
        fired = sorted((f for f in self.result.fired if not f.skipped and f.t), key=lambda f: f.t)
        for f in fired:
            f.recover_s = recovery(times, f.t)
        # a repeat of a page a SIGKILLed worker had crawled counts for that kill; any other, for
        # the last fault before it that hit Redis (else the last fault before it)
        killed = {f.hit: f for f in fired if f.fault.kind == "kill-worker"}
        first: dict[str, str] = {}
        for t, url, worker in arrivals:
            if url in first:
                before = [f for f in fired if f.t <= t]
                on_redis = [f for f in before if f.fault.kind in ("kill-node", "stop-node", "oom", "proxy-cut")]
                cause = killed.get(first[url]) or (on_redis or before or [None])[-1]
                if cause is not None and cause.t <= t:
                    cause.twice += 1
            else:
                first[url] = worker


def recovery(times: list[float], t0: float, step: float = 0.1) -> float | None:
    """Seconds from ``t0`` until the crawl's rate is back: once a second's pages fell below
    half the pages/s of the 3 s before ``t0``, until a second brings that many again (0 if it
    did not fall within FALL_WITHIN_S; the time to the next page when nothing came before);
    None if it never came back."""
    times = sorted(times)
    before = (bisect.bisect_left(times, t0) - bisect.bisect_left(times, t0 - 3)) / 3
    after = times[bisect.bisect_left(times, t0):]
    if not after:
        return None
    if before < 3:
        return after[0] - t0
    need = max(1, int(before / 2))

    def second_to(t: float) -> int:
        return bisect.bisect_right(times, t) - bisect.bisect_right(times, t - 1)

    t, fell = t0, False
    while t <= times[-1] + step:
        enough = second_to(t) >= need
        if not fell and not enough:
            fell = True
        elif fell and enough:
            return t - t0
        if not fell and t - t0 > FALL_WITHIN_S:
            return 0.0
        t += step
    return None if fell else 0.0


def leftovers(url: str, crawl: str) -> tuple[list[str], list[str]]:
    """What the crawl still has in Redis: per site, queued or leased requests, delayed ones
    and dead letters; then the sites whose counters do not balance (enqueued = acked + dead)."""
    f = frontier(url, crawl)
    left, off = [], []
    for site in f.sites():
        st = f.status(site)
        if (st.backlog, st.pending, st.delayed) != (0, 0, 0):
            left.append(f"{site}: backlog {st.backlog}, leased {st.pending}, delayed {st.delayed}")
        dead = len(f.dead_letters(site))
        if dead:
            left.append(f"{site}: {dead} dead letters")
        counts = {k: st.stats.get(k, 0) for k in ("enqueued", "acked", "dead")}
        if counts["enqueued"] != counts["acked"] + counts["dead"]:
            off.append(f"{site}: {counts}")
    return left, off


def oom_refusals(node: RedisServer) -> int:
    """Commands ``node`` refused with OOM since it started (0 if it does not answer)."""
    info = _ask(node, "INFO", "errorstats")
    return int(info.get("errorstat_OOM", {}).get("count", 0)) if isinstance(info, dict) else 0


def run_campaign(
    setup: str, seed: int, workdir: Path, say: Callable[[str], None] | None = None, tracked: bool = False,
) -> RunResult:
    """Run seed ``seed`` on ``setup`` with its files in ``workdir`` (``tracked``: a share of
    the pages tracked); never raises for a failure of the crawl (see :meth:`RunResult.failures`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return Campaign(setup, seed, workdir, say, tracked=tracked).run()
