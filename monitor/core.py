"""The monitor: a Prometheus exporter of every crawl's frontier, node liveness, and alerts.

It only reads (a read-only ACL user is enough: ``+@read +evalsha_ro +eval_ro
+time +ping +info``; add ``+subscribe &ss:*`` for node events and ``+bf.card`` for
``streams_sched_seen_estimate`` with RedisBloom). ``INFO memory stats`` of every
master gives the ``streams_sched_redis_*`` metrics (evictions, memory) and their alerts. Reads happen on scrape, or
reuse the last one within ``--cache-seconds``, and every ``--interval``
seconds for the alerts, which are POSTed to ``--webhook-url``.

What one read costs is in snapshot.py: per crawl, a few commands per shard, then the
sites the shards' indexes name (at most ``--index-sites`` per shard and index), the
labelled sites and a ``--sweep-sites`` slice of the registries; it does not grow with
the number of idle sites. The monitor keeps a :class:`~monitor.snapshot.SiteBook` per
crawl for the crawl-wide sums.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from redis.exceptions import ResponseError

from streams_sched.connect.cluster_health import cluster_down_line
from streams_sched.connect.server_checks import ServerMemory, hint_for, read_memory
from streams_sched.errors import CrawlMoved
from streams_sched.frontier.client import Frontier
from streams_sched.service.daemon import (
    TRANSIENT,
    MetricsServer,
    StopFlag,
    check_server,
    connect_at_start,
    run_passes,
)
from streams_sched.service.moves import MovedCrawls
from streams_sched.service.liveness import ALIVE, DEAD, NodeState, node_states

from .alerts import FIRING, AlertRules, Debouncer
from .events import EventListener
from .exporter import FrontierCollector, SiteLabeller
from .scaling import Scaling, WorkerRates, crawl_demand, workers_wanted
from .settings import MonitorSettings
from .snapshot import CrawlSnapshot, SiteBook, read_crawl
from .state import AlertState
from .webhook import WebhookSender, render

__all__ = ["Monitor", "View"]

log = structlog.get_logger("monitor")


@dataclass
class View:
    """What one read of Redis saw (or why it failed)."""

    ok: bool
    snaps: list[CrawlSnapshot] = field(default_factory=list)
    states: dict[str, dict[str, NodeState]] = field(default_factory=dict)
    read_s: float = 0.0
    at: float = 0.0  # time.monotonic() of the read
    error: str | None = None
    #: memory, maxmemory, policy and evictions of every Redis master (none without +info)
    servers: list[ServerMemory] = field(default_factory=list)
    #: per crawl: what its sites allow and have work for, one worker's rate, workers wanted
    scaling: dict[str, Scaling] = field(default_factory=dict)


class Monitor:
    """Reads the frontier for the exporter and the alerts.

    ``run()`` serves ``/metrics`` and evaluates alerts every interval until
    SIGTERM/SIGINT; ``run_once()`` is one evaluation (burst mode, tests).
    """

    def __init__(self, settings: MonitorSettings, client: Any = None) -> None:
        from prometheus_client import CollectorRegistry

        self.settings = settings
        self.client = client
        self.stop_flag = StopFlag()
        self.labeller = SiteLabeller(settings.max_sites)
        self.rules = AlertRules(settings.backlog_threshold, settings.dlq_quiet_s)
        self.debouncer = Debouncer()
        self.state = AlertState(settings.state_file) if settings.state_file else None
        if self.state is not None:
            self.state.load(self.rules, self.debouncer, time.monotonic())
        self.sender: WebhookSender | None = None
        self.events: EventListener | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(FrontierCollector(self))
        self.metrics_server: MetricsServer | None = None
        self._lock = threading.Lock()
        self._view = View(ok=False, error="not read yet")
        self._frontiers: dict[str, Frontier] = {}
        self._books: dict[str, SiteBook] = {}
        #: per crawl, one worker's rate as the heartbeats measure it
        self._rates: dict[str, WorkerRates] = {}
        #: (what, crawl) said once and turned off: "seen" (the seen estimate is refused),
        #: ("info", "") (INFO is refused)
        self._said: set[tuple[str, str]] = set()
        self._crawls: list[str] = list(settings.crawls)
        self._moved = MovedCrawls(log)
        #: servers seen refusing writes at maxmemory, and since when (time.monotonic())
        self._refusing: dict[str, float] = {}
        self.passes = 0
        self.alerts_sent = 0

    # -- lifecycle ------------------------------------------------------------

    def connect(self) -> None:
        """Connect, then check the server's eviction policy (EvictionPolicyError on allkeys-*)."""
        if self.client is None:
            self.client = connect_at_start(self.settings.redis_url, self.settings.connect_timeout_s)
            check_server(self.client, self.settings.redis_url, allowed=self.settings.allow_eviction, log=log,
                         stop_flag=self.stop_flag)

    def start(self) -> None:
        """Start the metrics server, the event listener and the webhook sender."""
        s = self.settings
        if s.webhook_url and self.sender is None:
            self.sender = WebhookSender(s.webhook_url, s.webhook_secret)
            self.sender.start()
        if s.burst:
            return
        if self.metrics_server is None:
            self.metrics_server = MetricsServer(self.registry, s.metrics_port, s.metrics_addr).start()
            log.info("metrics", url=f"http://{s.metrics_addr}:{self.metrics_server.port}/metrics")
        if s.events and self.events is None:
            self.events = EventListener(self.client, lambda: list(self._crawls), s.max_backoff_s)
            self.events.start()

    def stop(self) -> None:
        self.stop_flag.set()

    def close(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.events is not None:
            self.events.stop()
            self.events.join(2.0)
            self.events = None
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        if self.client is not None:
            self.client.close()

    # -- reading --------------------------------------------------------------

    def crawls(self) -> list[str]:
        """The crawls to watch, without those that moved (CrawlMoved once all have)."""
        crawls = list(self.settings.crawls) if self.settings.crawls else Frontier.crawls(self.client)
        return self._moved.keep(self.client, crawls)

    def read(self) -> View:
        """Read every crawl now; the result is cached for scrapes."""
        with self._lock:
            started = time.monotonic()
            try:
                crawls = self.crawls()
                self._crawls = crawls
                snaps = [self._read_crawl(c) for c in crawls]
                servers = self._read_servers()
            except TRANSIENT + (ResponseError,) as exc:
                self._view = View(ok=False, read_s=time.monotonic() - started, at=started, error=str(exc))
                raise
            now = time.monotonic()
            states = {snap.crawl: self._states(snap, now) for snap in snaps}
            for snap in snaps:
                self.labeller.update(snap)
            scaling = {snap.crawl: self._scaling(snap, states[snap.crawl]) for snap in snaps}
            self._view = View(True, snaps, states, now - started, started, servers=servers, scaling=scaling)
            return self._view

    def _scaling(self, snap: CrawlSnapshot, states: Mapping[str, NodeState]) -> Scaling:
        s = self.settings
        rates = self._rates.setdefault(snap.crawl, WorkerRates())
        rates.observe(snap.nodes, [n for n, st in states.items() if st.state == ALIVE])
        demand = crawl_demand(snap, horizon_s=s.scale_horizon_s)
        rate = rates.rate(s.worker_rate)
        return Scaling(demand, rate, workers_wanted(demand, rate, s.max_workers))

    def view(self, max_age_s: float) -> View:
        """The last read if younger than ``max_age_s``, else a new one (never raises)."""
        with self._lock:
            view = self._view
        if view.ok and time.monotonic() - view.at <= max_age_s:
            return view
        try:
            return self.read()
        except TRANSIENT + (ResponseError, CrawlMoved) as exc:  # a moved crawl: the pass loop stops the monitor
            log.warning("read_failed", error=str(exc))
            with self._lock:
                return self._view

    def _read_crawl(self, crawl: str) -> CrawlSnapshot:
        """One crawl's snapshot."""
        f = self._frontiers.get(crawl)
        if f is None:
            f = self._frontiers[crawl] = Frontier(self.client, crawl)
        book = self._books.setdefault(crawl, SiteBook())
        s = self.settings

        def read(seen: bool) -> CrawlSnapshot:
            return read_crawl(f, seen=seen, book=book, labelled=sorted(self.labeller.labelled.get(crawl, ())),
                              index_per_shard=s.index_sites, sweep=s.sweep_sites)

        try:
            return read(("seen", crawl) not in self._said)
        except PermissionError as exc:
            self._said.add(("seen", crawl))
            log.warning(
                "seen_estimate_off", crawl=crawl, error=str(exc),
                hint="allow +bf.card for streams_sched_seen_estimate with RedisBloom",
            )
            return read(False)

    def _read_servers(self) -> list[ServerMemory]:
        """INFO memory stats of every master; none (said once) where INFO is refused: the
        rest of the read goes on."""
        if ("info", "") in self._said:
            return []
        try:
            return read_memory(self.client)
        except ResponseError as exc:  # NOPERM (an ACL user without +info), or INFO renamed away
            self._said.add(("info", ""))
            log.warning(
                "redis_metrics_off", error=str(exc),
                hint="allow +info for the streams_sched_redis_* metrics (evictions, memory) and their alerts",
            )
            return []

    def _say_refusals(self, servers: list[ServerMemory], now: float) -> None:
        """One ERROR when a server starts refusing writes at maxmemory (the workers then
        wait, and the crawl stalls), one warning when it stops. The monitor only reads, so
        it goes on; the ``redis_memory`` alert fires from 90% of maxmemory. A failed
        snapshot (MISCONF) shows as refused reads (run_passes), and a replica refuses
        writes but is fine to read."""
        for sm in servers:
            since = self._refusing.get(sm.server)
            if sm.refuses_writes and since is None:
                self._refusing[sm.server] = now
                log.error(
                    "redis_refuses_writes", server=sm.server, reason="OOM", used_memory=sm.used_memory,
                    maxmemory=sm.maxmemory, policy=sm.policy, hint=hint_for("OOM", "monitor"),
                )
            elif not sm.refuses_writes and since is not None:
                del self._refusing[sm.server]
                log.warning("redis_accepts_writes_again", server=sm.server, after_s=round(now - since, 1))

    def _states(self, snap: CrawlSnapshot, now: float) -> dict[str, NodeState]:
        heard = self.events.ages(snap.crawl, now) if self.events is not None else {}
        # a node whose record is gone (forgotten by the reclaimer) is gone, whatever events said
        heard = {n: v for n, v in heard.items() if n in snap.nodes or v[0] <= 60}
        return node_states(snap.nodes, snap.now_s, heard, self.settings.dead_after_heartbeats)

    # -- one pass -------------------------------------------------------------

    def run_once(self) -> View:
        """Read Redis, evaluate the alerts, queue the notifications. Raises on Redis errors."""
        view = self.read()
        now_s = time.monotonic()
        self._say_refusals(view.servers, now_s)
        conditions = self.rules.evaluate(view.snaps, view.states, now_s, view.servers)
        changes = self.debouncer.update(conditions)
        if self.state is not None:
            try:
                self.state.save(self.rules, self.debouncer, now_s)
            except OSError as exc:
                log.error("state_file_not_written", path=str(self.state.path), error=str(exc),
                          hint="alerts still go out; after a restart those still firing would be sent again")
        sent = 0
        for status, alert in changes:
            log.warning("alert", status=status, kind=alert.kind, crawl=alert.crawl, subject=alert.subject, summary=alert.summary)
            if self.sender is not None and (status == FIRING or self.settings.send_resolved):
                self.sender.send(render(alert, status, self.settings.webhook_format))
                sent += 1
        self.passes += 1
        self.alerts_sent += sent
        log.info(
            "pass",
            crawls=len(view.snaps),
            sites=sum(s.site_count for s in view.snaps),
            sites_read=sum(len(s.sites) for s in view.snaps),
            backlog=sum(st.backlog for s in view.snaps for st in s.sites),
            pending=sum(st.pending for s in view.snaps for st in s.sites),
            dead_letters=sum(s.dead_letters for s in view.snaps),
            nodes_alive=sum(1 for c in view.states.values() for n in c.values() if n.state == ALIVE),
            nodes_dead=sum(1 for c in view.states.values() for n in c.values() if n.state == DEAD),
            alerts_active=len(self.debouncer.active),
            notifications=sent,
            read_s=round(view.read_s, 4),
        )
        return view

    def run(self) -> int:
        """Loop until stopped. Returns the process exit code."""
        s = self.settings
        self.connect()
        self.start()
        log.info(
            "started",
            crawls=list(s.crawls) or "all",
            interval_s=s.interval_s,
            metrics_port=None if s.burst else (self.metrics_server.port if self.metrics_server else s.metrics_port),
            webhook=bool(s.webhook_url),
            backlog_threshold=s.backlog_threshold,
            burst=s.burst,
            pid=os.getpid(),
        )
        code = run_passes(
            self.run_once,
            interval_s=s.interval_s,
            burst=s.burst,
            stop_flag=self.stop_flag,
            max_backoff_s=s.max_backoff_s,
            log=log,
            role="monitor",
            hint="retrying with back-off; /metrics reports streams_sched_redis_up 0 meanwhile",
            diagnose=lambda: cluster_down_line(self.client),
        )
        if code != 0:
            return code
        if s.burst:
            from prometheus_client import generate_latest

            sys.stdout.write(generate_latest(self.registry).decode())
            sys.stdout.flush()
        log.info("stopped", passes=self.passes, notifications=self.alerts_sent, signal=self.stop_flag.signal)
        return 0
