"""Alert conditions and their debouncing (pure).

Conditions, evaluated on every monitor pass:

- ``backlog``: a site's backlog (all bands and task types) is above
  ``--backlog-threshold`` (0 = off), for the sites a read looked at: every site with
  backlog while the shards' ready indexes are no longer than ``--index-sites``;
- ``node_dead``: a worker node is dead (silent for three heartbeats without
  saying goodbye);
- ``dead_letters``: a crawl's dead-letter count grew; the condition holds until
  ``--dlq-quiet-seconds`` pass without further growth;
- ``redis_evicting``: a Redis server's ``evicted_keys`` grew while a crawl is running
  (an alive worker node or a leased request, now or within :data:`RUNNING_WINDOW_S`:
  an allkeys-* Redis evicts the crawl registry and the node records too, so the
  crawl it is destroying soon looks like none): what it evicted may be queued
  requests, lost silently. It holds, like ``dead_letters``, until
  ``--dlq-quiet-seconds`` pass without further evictions;
- ``redis_memory``: a Redis server uses 90% or more of its ``maxmemory`` (only where
  maxmemory is set): at 100% noeviction refuses writes (the crawl stalls) and any
  other policy evicts.

:class:`Debouncer` turns the set of active conditions into notifications: one
``firing`` when a condition starts, nothing while it holds, one ``resolved``
when it clears. A condition that clears and comes back fires again.

Both keep state between passes (the dead-letter and eviction baselines, the active
alerts); ``snapshot()`` / ``restore()`` turn it into
plain JSON data, so a restarted monitor (``--state-file``) neither repeats an
alert that is still firing nor forgets one that cleared while it was down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streams_sched.connect.server_checks import ServerMemory
from streams_sched.service.liveness import ALIVE, DEAD, NodeState

from .snapshot import CrawlSnapshot

__all__ = ["Alert", "AlertRules", "Debouncer", "FIRING", "MEMORY_HIGH", "RESOLVED", "RUNNING_WINDOW_S"]

FIRING = "firing"
RESOLVED = "resolved"
#: ``redis_memory`` holds from this share of maxmemory on
MEMORY_HIGH = 0.9
#: a crawl seen running this recently still counts as running for ``redis_evicting``
#: (the same 15 minutes as the StreamsSchedRedisEvicting rule's max_over_time)
RUNNING_WINDOW_S = 900.0


@dataclass(frozen=True)
class Alert:
    #: identity of the condition: kind, crawl, subject
    key: tuple[str, str, str]
    kind: str
    crawl: str
    #: site (backlog), node (node_dead), server (redis_evicting, redis_memory; crawl "")
    #: or "" (dead_letters)
    subject: str
    value: float
    threshold: float
    summary: str


@dataclass
class _DlqTrack:
    count: int
    grew_at: float | None = None


@dataclass
class AlertRules:
    """Evaluates the conditions; keeps the dead-letter counts between passes."""

    backlog_threshold: int = 0
    dlq_quiet_s: float = 600.0
    _dlq: dict[str, _DlqTrack] = field(default_factory=dict)
    #: evicted_keys of each server, and when it last grew
    _evicted: dict[str, _DlqTrack] = field(default_factory=dict)
    #: when a crawl was last seen running (monotonic)
    _running_at: float | None = None

    def evaluate(
        self,
        snaps: Sequence[CrawlSnapshot],
        states: Mapping[str, Mapping[str, NodeState]],
        now_s: float,
        servers: Sequence[ServerMemory] = (),
    ) -> dict[tuple[str, str, str], Alert]:
        """The conditions that hold now (``now_s``: a monotonic clock; ``servers``: what
        INFO said of each Redis server, none when the monitor may not run INFO)."""
        active: dict[tuple[str, str, str], Alert] = {}
        if any(ns.state == ALIVE for nodes in states.values() for ns in nodes.values()) or any(
            snap.leased for snap in snaps
        ):
            self._running_at = now_s
        running = self._running_at is not None and now_s - self._running_at < RUNNING_WINDOW_S
        for sm in servers:
            self._server_alerts(sm, running, now_s, active)

        def add(kind: str, crawl: str, subject: str, value: float, threshold: float, summary: str) -> None:
            key = (kind, crawl, subject)
            active[key] = Alert(key, kind, crawl, subject, value, threshold, summary)

        for snap in snaps:
            c = snap.crawl
            if self.backlog_threshold > 0:
                for st in snap.sites:
                    if st.backlog > self.backlog_threshold:
                        add(
                            "backlog", c, st.site, st.backlog, self.backlog_threshold,
                            f"backlog of site {st.site} in crawl {c} is {st.backlog}"
                            f" (threshold {self.backlog_threshold})",
                        )
            for node, ns in states.get(c, {}).items():
                if ns.state == DEAD:
                    host = ns.info.get("host", "?")
                    add(
                        "node_dead", c, node, round(ns.silent_s, 1), 3 * ns.heartbeat_s,
                        f"worker node {node} (host {host}) of crawl {c} is dead: silent for"
                        f" {ns.silent_s:.0f}s (heartbeat every {ns.heartbeat_s:g}s)",
                    )
            count = snap.dead_letters
            track = self._dlq.get(c)
            if track is None:
                self._dlq[c] = _DlqTrack(count)  # the first look is the baseline
                continue
            grew_by = count - track.count
            if grew_by > 0:
                track.grew_at = now_s
            track.count = count
            if track.grew_at is not None and (grew_by > 0 or now_s - track.grew_at < self.dlq_quiet_s):
                add(
                    "dead_letters", c, "", count, 0,
                    f"dead letters of crawl {c} are growing: {count} now"
                    + (f" (+{grew_by} since the last look)" if grew_by > 0 else ""),
                )
        return active

    def _server_alerts(self, sm: ServerMemory, running: bool, now_s: float, active: dict[tuple[str, str, str], Alert]) -> None:
        track = self._evicted.get(sm.server)
        if track is None or sm.evicted_keys < track.count:  # the first look, or Redis restarted
            self._evicted[sm.server] = _DlqTrack(sm.evicted_keys)
        else:
            grew_by = sm.evicted_keys - track.count
            if grew_by > 0 and running:
                track.grew_at = now_s
            track.count = sm.evicted_keys
            if track.grew_at is not None and (grew_by > 0 and running or now_s - track.grew_at < self.dlq_quiet_s):
                key = ("redis_evicting", "", sm.server)
                active[key] = Alert(
                    key, "redis_evicting", "", sm.server, sm.evicted_keys, 0,
                    f"Redis {sm.server} (maxmemory-policy {sm.policy or '?'}) evicts keys while a crawl runs:"
                    f" {sm.evicted_keys} evicted"
                    + (f" (+{grew_by} since the last look)" if grew_by > 0 else "")
                    + "; evicted queued requests are pages lost silently. Set maxmemory-policy noeviction",
                )
        if sm.maxmemory > 0 and sm.used_memory >= MEMORY_HIGH * sm.maxmemory:
            key = ("redis_memory", "", sm.server)
            share = sm.used_memory / sm.maxmemory
            active[key] = Alert(
                key, "redis_memory", "", sm.server, round(share, 3), MEMORY_HIGH,
                f"Redis {sm.server} uses {share:.0%} of its maxmemory ({sm.used_memory} of {sm.maxmemory} bytes):"
                " raise maxmemory, add a shard, or purge finished crawls (streams-sched purge)",
            )

    def snapshot(self, now_s: float) -> dict[str, Any]:
        """The dead-letter baselines as JSON data; growth times as ages (``now_s``: monotonic)."""
        return _tracks_snapshot(self._dlq, now_s)

    def restore(self, data: Mapping[str, Any], now_s: float, elapsed_s: float) -> None:
        """Take back a :meth:`snapshot` taken ``elapsed_s`` seconds ago."""
        self._dlq.update(_tracks_restore(data, now_s, elapsed_s))

    def snapshot_evictions(self, now_s: float) -> dict[str, Any]:
        """The servers' evicted_keys baselines, as :meth:`snapshot` gives the dead letters'."""
        return _tracks_snapshot(self._evicted, now_s)

    def restore_evictions(self, data: Mapping[str, Any], now_s: float, elapsed_s: float) -> None:
        self._evicted.update(_tracks_restore(data, now_s, elapsed_s))


def _tracks_snapshot(tracks: Mapping[str, _DlqTrack], now_s: float) -> dict[str, Any]:
    return {
        name: {"count": t.count, "grew_ago_s": None if t.grew_at is None else max(0.0, now_s - t.grew_at)}
        for name, t in tracks.items()
    }


def _tracks_restore(data: Mapping[str, Any], now_s: float, elapsed_s: float) -> dict[str, _DlqTrack]:
    out = {}
    for name, t in data.items():
        ago = t.get("grew_ago_s")
        grew_at = None if ago is None else now_s - float(ago) - elapsed_s
        out[str(name)] = _DlqTrack(int(t["count"]), grew_at)
    return out


class Debouncer:
    """One notification when a condition starts, one when it clears."""

    def __init__(self) -> None:
        self.active: dict[tuple[str, str, str], Alert] = {}

    def update(self, conditions: Mapping[tuple[str, str, str], Alert]) -> list[tuple[str, Alert]]:
        out: list[tuple[str, Alert]] = []
        for key, alert in conditions.items():
            if key not in self.active:
                out.append((FIRING, alert))
            self.active[key] = alert
        for key in [k for k in self.active if k not in conditions]:
            out.append((RESOLVED, self.active.pop(key)))
        return out

    def snapshot(self) -> list[dict[str, Any]]:
        return [asdict(a) for a in self.active.values()]

    def restore(self, data: Sequence[Mapping[str, Any]]) -> None:
        for item in data:
            alert = Alert(**{**item, "key": tuple(item["key"])})
            if len(alert.key) != 3:
                raise ValueError(f"alert key {alert.key!r}: expected (kind, crawl, subject)")
            self.active[alert.key] = alert
