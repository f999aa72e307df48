"""Alert conditions and their debouncing (pure).

Conditions, evaluated on every monitor pass:

- ``backlog``: a site's backlog (all bands and task types) is above
  ``--backlog-threshold`` (0 = off);
- ``node_dead``: a worker node is dead (silent for three heartbeats without
  saying goodbye);
- ``dead_letters``: a crawl's dead-letter count grew; the condition holds until
  ``--dlq-quiet-seconds`` pass without further growth.

:class:`Debouncer` turns the set of active conditions into notifications: one
``firing`` when a condition starts, nothing while it holds, one ``resolved``
when it clears. A condition that clears and comes back fires again.

Both keep state between passes; ``snapshot()`` / ``restore()`` turn it into
plain JSON data, so a restarted monitor (``--state-file``) neither repeats an
alert that is still firing nor forgets one that cleared while it was down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from streams_sched.liveness import DEAD, NodeState

from .snapshot import CrawlSnapshot

__all__ = ["Alert", "AlertRules", "Debouncer", "FIRING", "RESOLVED"]

FIRING = "firing"
RESOLVED = "resolved"


@dataclass(frozen=True)
class Alert:
    #: identity of the condition: kind, crawl, subject
    key: tuple[str, str, str]
    kind: str
    crawl: str
    #: site (backlog), node (node_dead) or "" (dead_letters)
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

    def evaluate(
        self,
        snaps: Sequence[CrawlSnapshot],
        states: Mapping[str, Mapping[str, NodeState]],
        now_s: float,
    ) -> dict[tuple[str, str, str], Alert]:
        """The conditions that hold now (``now_s``: a monotonic clock)."""
        active: dict[tuple[str, str, str], Alert] = {}

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

    def snapshot(self, now_s: float) -> dict[str, Any]:
        """The dead-letter baselines as JSON data; growth times as ages (``now_s``: monotonic)."""
        return {
            crawl: {"count": t.count, "grew_ago_s": None if t.grew_at is None else max(0.0, now_s - t.grew_at)}
            for crawl, t in self._dlq.items()
        }

    def restore(self, data: Mapping[str, Any], now_s: float, elapsed_s: float) -> None:
        """Take back a :meth:`snapshot` taken ``elapsed_s`` seconds ago."""
        for crawl, t in data.items():
            ago = t.get("grew_ago_s")
            grew_at = None if ago is None else now_s - float(ago) - elapsed_s
            self._dlq[str(crawl)] = _DlqTrack(int(t["count"]), grew_at)


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
