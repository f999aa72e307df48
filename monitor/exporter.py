"""Prometheus metric families built from crawl snapshots (pure), and the collector.

Label cardinality is bounded: per crawl, at most ``max_sites`` sites get their
own ``site`` label (:class:`SiteLabeller`); every other site is summed into
``site="_other"`` (``oldest_pending_seconds`` takes the maximum). A site keeps
its label for the monitor's lifetime once it has one (the monitor reads a labelled
site every time); when there is room, new sites get labels in order of backlog +
pending, largest first. ``_other``'s gauges (backlog, pending, delayed) sum the sites
the shards' indexes name, which are all the sites with such work unless an index
is longer than the monitor reads (``--index-sites``); ``_other``'s counters are the
crawl-wide sums (snapshot.SiteBook) less the labelled sites'. ``_other``'s counters
can go down when a site is purged; Prometheus' ``rate()`` treats that as a counter
reset.

The ``streams_sched_node_*`` families have one sample per live worker with the
browser capability (its heartbeat's browser leases, cap and renders): as many
labels as such workers, however many sites.

The ``streams_sched_redis_*`` families describe the Redis servers (every master of
a cluster, labelled ``server`` host:port): evictions, memory, maxmemory and policy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from streams_sched.connect.server_checks import ServerMemory
from streams_sched.frontier.keys import BANDS
from streams_sched.politeness.adaptive import effective_rate
from streams_sched.service.liveness import ALIVE, DEAD, NodeState

from .scaling import Scaling
from .snapshot import CrawlSnapshot

__all__ = ["FAMILIES", "OTHER", "SERVER_FAMILIES", "SiteLabeller", "build_families", "build_server_families", "metric_names"]

#: site label of the sites without their own
OTHER = "_other"

#: Every family the monitor exports: name -> (type, labels, help). Counters are
#: listed without the ``_total`` suffix that the exposition adds.
FAMILIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "streams_sched_backlog": ("gauge", ("crawl", "site", "priority"), "Entries not yet delivered to any worker, by priority band."),
    "streams_sched_pending": ("gauge", ("crawl", "site"), "Entries leased by a worker and not yet acked."),
    "streams_sched_oldest_pending_seconds": ("gauge", ("crawl", "site"), "Idle time of the oldest pending lease (0 when none)."),
    "streams_sched_delayed": ("gauge", ("crawl", "site"), "Requests waiting in the delay queue."),
    "streams_sched_enqueued": ("counter", ("crawl", "site"), "Requests added to the frontier (kept in Redis, summed over workers)."),
    "streams_sched_acked": ("counter", ("crawl", "site"), "Requests finished and acked (kept in Redis, summed over workers)."),
    "streams_sched_dead_letters": ("gauge", ("crawl",), "Entries in the dead-letter streams."),
    "streams_sched_dead_lettered": ("counter", ("crawl",), "Entries ever moved to dead letters."),
    "streams_sched_reclaimed": ("counter", ("crawl",), "Expired leases taken over by workers or requeued by the reclaimer."),
    "streams_sched_duplicates": ("counter", ("crawl",), "Requests dropped as duplicates by the Redis seen filter."),
    "streams_sched_nodes": ("gauge", ("crawl", "state"), "Worker nodes by state: alive, or dead (silent for 3 heartbeats)."),
    "streams_sched_local_requests": (
        "gauge", ("crawl", "state"),
        "Requests only one worker holds (they cannot travel through the queue), by its state; dead: lost.",
    ),
    "streams_sched_node_browser_leases": (
        "gauge", ("crawl", "node"),
        "Browser leases a live worker with the browser capability holds (prefetched or rendering), from its heartbeat.",
    ),
    "streams_sched_node_browser_max": (
        "gauge", ("crawl", "node"), "The browser cap (STREAMS_BROWSER_MAX) of a live worker with the browser capability.",
    ),
    "streams_sched_node_renders": ("counter", ("crawl", "node"), "Browser tasks a live worker has downloaded (rendered or failed)."),
    "streams_sched_node_render_seconds": (
        "counter", ("crawl", "node"),
        "Seconds a live worker's browser tasks spent in its downloader (over streams_sched_node_renders: the mean render time).",
    ),
    "streams_sched_sites": ("gauge", ("crawl", "state"), "Registered sites by state: active or paused."),
    "streams_sched_workers_wanted": ("gauge", ("crawl",), "Workers the crawl can use now: what its sites allow and have work for, over one worker's rate; at least 1 while a request is leased, 0 when nothing is ready or leased. The autoscaling signal (monitor/scaling.py)."),
    "streams_sched_demand_requests_per_second": ("gauge", ("crawl",), "Requests/s the crawl's sites allow and have http work for now (rates, pauses and backlogs; unlimited sites spread over --scale-horizon-seconds)."),
    "streams_sched_worker_rate_requests_per_second": ("gauge", ("crawl",), "One worker's requests/s, as workers_wanted divides by it: --worker-rate, or measured from the heartbeats."),
    "streams_sched_sites_unlabelled": ("gauge", ("crawl",), "Sites summed into site=\"_other\" (over --max-sites)."),
    "streams_sched_indexed_sites": (
        "gauge", ("crawl", "index"),
        "Sites the shards' indexes name: ready_http, ready_browser (backlog or delayed requests), leased.",
    ),
    "streams_sched_monitor_sites_read": ("gauge", ("crawl",), "Sites the monitor's last read looked at (indexed, labelled, a slice of the registry)."),
    "streams_sched_seen_estimate": ("gauge", ("crawl",), "Fingerprints in the seen filters (where the back-end and ACL can tell)."),
    "streams_sched_site_rate_limit": ("gauge", ("crawl", "site", "reason"), "Requests per second a site is held to now, all workers together (0 = unlimited or paused), and why: policy, robots, backoff, retry-after, paused, unlimited. Labelled sites only."),
    "streams_sched_site_paused_until_seconds": ("gauge", ("crawl", "site"), "Epoch seconds until which a Retry-After pauses the site (0 = not paused). Labelled sites only."),
    "streams_sched_throttled": ("counter", ("crawl", "site"), "429 and 503 answers the workers reported (kept in Redis)."),
    "streams_sched_timeouts": ("counter", ("crawl",), "Download timeouts the workers reported (kept in Redis)."),
    "streams_sched_backoffs": ("counter", ("crawl",), "Times a site's shared rate was cut by the adaptive back-off."),
    "streams_sched_over_cap": ("counter", ("crawl", "site"), "Requests dropped because their site reached its max_pages."),
    "streams_sched_tracked_pages": ("gauge", ("crawl", "site"), "Pages tracked now: each comes back on its own schedule (continuous crawling)."),
    "streams_sched_revisits": ("counter", ("crawl", "site"), "Visits of tracked pages scheduled by their acks."),
    "streams_sched_revisits_changed": ("counter", ("crawl", "site"), "Revisits of adaptive pages that found a change (over the adaptive ones: how often pages change)."),
    "streams_sched_revisits_unchanged": ("counter", ("crawl", "site"), "Revisits of adaptive pages that found no change: fetches a fixed schedule would have wasted too."),
    "streams_sched_revisits_change_share": ("gauge", ("crawl", "site"), "Share of adaptive revisits that found a change, over the site's counters (0 when none compared yet)."),
    "streams_sched_overdue": ("gauge", ("crawl", "site"), "Delayed requests past their due time (tracked pages' revisits among them): waiting for their site's rate or for a worker."),
    "streams_sched_oldest_overdue_seconds": ("gauge", ("crawl", "site"), "How long the oldest overdue delayed request has been due (0 when none)."),
    "streams_sched_overdue_intervals": ("gauge", ("crawl", "site"), "How many of its own intervals the oldest overdue tracked page is late by (0 when none): the freshness alert's measure."),
    "streams_sched_revisit_demand_requests_per_second": ("gauge", ("crawl", "site"), "Fetches per second the tracked pages need at their own intervals (sum of 1/interval)."),
    "streams_sched_revisit_stretch": ("gauge", ("crawl", "site"), "Factor the revisits are stretched by because their site's tracked pages need more than its rate allows (1 = none). Labelled sites, and the largest of _other's."),
    "streams_sched_redis_evicted_keys": (
        "counter", ("server",),
        "Keys the Redis server evicted since it started (INFO stats evicted_keys); while a crawl runs they can be queued requests, lost silently.",
    ),
    "streams_sched_redis_used_memory_bytes": ("gauge", ("server",), "Memory the Redis server uses (INFO memory used_memory)."),
    "streams_sched_redis_maxmemory_bytes": ("gauge", ("server",), "The Redis server's maxmemory (0 = no limit)."),
    "streams_sched_redis_maxmemory_policy": (
        "gauge", ("server", "policy"), "1, labelled with the Redis server's maxmemory-policy (only noeviction never evicts).",
    ),
    "streams_sched_redis_up": ("gauge", (), "1 if the last read of Redis succeeded, else 0."),
    "streams_sched_monitor_read_seconds": ("gauge", (), "Seconds the last read of Redis took."),
}


#: the families about the Redis servers themselves, one sample per master (INFO memory stats)
SERVER_FAMILIES = (
    "streams_sched_redis_evicted_keys",
    "streams_sched_redis_used_memory_bytes",
    "streams_sched_redis_maxmemory_bytes",
    "streams_sched_redis_maxmemory_policy",
)


def metric_names() -> set[str]:
    """Every sample name the monitor can expose (counters with ``_total``)."""
    return {name + "_total" if kind == "counter" else name for name, (kind, _, _) in FAMILIES.items()}


def _family(name: str) -> Any:
    kind, labels, doc = FAMILIES[name]
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, doc, labels=list(labels))


class SiteLabeller:
    """Decides which sites get their own ``site`` label (sticky, at most ``max_sites`` per crawl)."""

    def __init__(self, max_sites: int) -> None:
        self.max_sites = max_sites
        self.labelled: dict[str, set[str]] = {}

    def update(self, snap: CrawlSnapshot) -> None:
        present = {s.site for s in snap.sites}
        mine = self.labelled.setdefault(snap.crawl, set())
        mine &= present
        room = self.max_sites - len(mine)
        if room <= 0:
            return
        new = [s for s in snap.sites if s.site not in mine]
        new.sort(key=lambda s: (-(s.backlog + s.pending), s.site))
        mine.update(s.site for s in new[:room])

    def label(self, crawl: str, site: str) -> str:
        return site if site in self.labelled.get(crawl, ()) else OTHER

    def unlabelled(self, snap: CrawlSnapshot) -> int:
        mine = self.labelled.get(snap.crawl, set())
        if snap.shards is not None:
            return max(0, snap.site_count - len(mine))
        return sum(1 for s in snap.sites if s.site not in mine)


#: metric families by name, as ``_family`` builds them (counter or gauge families)
Families = dict[str, Any]


def build_families(
    snaps: Sequence[CrawlSnapshot],
    states: Mapping[str, Mapping[str, NodeState]],
    labeller: SiteLabeller,
    scaling: Mapping[str, Scaling] | None = None,
) -> list[Metric]:
    """The frontier's metric families for these snapshots (``states``: crawl -> node -> state;
    ``scaling``: crawl -> its scaling signal, where read)."""
    skip = {"streams_sched_redis_up", "streams_sched_monitor_read_seconds", *SERVER_FAMILIES}
    fam = {name: _family(name) for name in FAMILIES if name not in skip}
    for snap in snaps:
        _add_site_rows(fam, snap, _site_rows(fam, snap, labeller))
        _add_crawl(fam, snap, labeller)
        _add_nodes(fam, snap.crawl, states.get(snap.crawl, {}))
        sig = (scaling or {}).get(snap.crawl)
        if sig is not None:
            fam["streams_sched_workers_wanted"].add_metric([snap.crawl], sig.workers_wanted)
            fam["streams_sched_demand_requests_per_second"].add_metric([snap.crawl], sig.demand.requests_per_s)
            fam["streams_sched_worker_rate_requests_per_second"].add_metric([snap.crawl], sig.worker_rate)
    return list(fam.values())


def _site_rows(fam: Families, snap: CrawlSnapshot, labeller: SiteLabeller) -> dict[str, dict[str, Any]]:
    """The sums of each site label (site="_other" summing the sites without their own);
    the rate limits and pauses of the labelled sites go straight into ``fam``."""
    c = snap.crawl
    per: dict[str, dict[str, Any]] = {}
    for st in snap.sites:
        label = labeller.label(c, st.site)
        row = per.setdefault(label, _blank_row())
        if label != OTHER:
            eff = effective_rate(st.policy, st.now_ms, default_rate=snap.default_rate)
            fam["streams_sched_site_rate_limit"].add_metric([c, label, eff.reason], eff.rate)
            fam["streams_sched_site_paused_until_seconds"].add_metric([c, label], eff.paused_until_ms / 1000.0)
        row["throttled"] += st.stats.get("throttled", 0)
        row["over_cap"] += st.stats.get("over_cap", 0)
        for name in ("tracked", "revisits", "changed", "unchanged"):
            row[name] += st.stats.get(name, 0)
        row["overdue"] += st.overdue
        row["oldest_overdue"] = max(row["oldest_overdue"], st.oldest_overdue_s)
        row["overdue_intervals"] = max(row["overdue_intervals"], st.overdue_ratio)
        row["demand"] += st.revisit_demand_per_s
        row["stretch"] = max(row["stretch"], st.revisit_stretch)
        for band in BANDS:
            row["bands"][band] += st.band_backlog(band)
        row["pending"] += st.pending
        row["oldest"] = max(row["oldest"], st.oldest_pending_ms / 1000.0)
        row["delayed"] += st.delayed
        row["enqueued"] += st.stats.get("enqueued", 0)
        row["acked"] += st.stats.get("acked", 0)
    if snap.totals is not None:
        # the counters of site="_other": every site's (the book's sums) less the labelled ones'
        labelled = [r for label, r in per.items() if label != OTHER]
        if snap.site_count > len(labelled) or OTHER in per:
            other = per.setdefault(OTHER, _blank_row())
            for name in ("enqueued", "acked", "throttled", "over_cap", "tracked", "revisits", "changed", "unchanged"):
                other[name] = max(0, snap.stat(name) - sum(r[name] for r in labelled))
    return per


def _add_site_rows(fam: Families, snap: CrawlSnapshot, per: Mapping[str, Mapping[str, Any]]) -> None:
    c = snap.crawl
    for label in sorted(per):
        row = per[label]
        for band in BANDS:
            fam["streams_sched_backlog"].add_metric([c, label, band], row["bands"][band])
        fam["streams_sched_pending"].add_metric([c, label], row["pending"])
        fam["streams_sched_oldest_pending_seconds"].add_metric([c, label], row["oldest"])
        fam["streams_sched_delayed"].add_metric([c, label], row["delayed"])
        fam["streams_sched_enqueued"].add_metric([c, label], row["enqueued"])
        fam["streams_sched_acked"].add_metric([c, label], row["acked"])
        fam["streams_sched_throttled"].add_metric([c, label], row["throttled"])
        fam["streams_sched_over_cap"].add_metric([c, label], row["over_cap"])
        fam["streams_sched_tracked_pages"].add_metric([c, label], row["tracked"])
        fam["streams_sched_revisits"].add_metric([c, label], row["revisits"])
        fam["streams_sched_revisits_changed"].add_metric([c, label], row["changed"])
        fam["streams_sched_revisits_unchanged"].add_metric([c, label], row["unchanged"])
        compared = row["changed"] + row["unchanged"]
        fam["streams_sched_revisits_change_share"].add_metric([c, label], row["changed"] / compared if compared else 0.0)
        fam["streams_sched_overdue"].add_metric([c, label], row["overdue"])
        fam["streams_sched_oldest_overdue_seconds"].add_metric([c, label], row["oldest_overdue"])
        fam["streams_sched_overdue_intervals"].add_metric([c, label], row["overdue_intervals"])
        fam["streams_sched_revisit_demand_requests_per_second"].add_metric([c, label], row["demand"])
        fam["streams_sched_revisit_stretch"].add_metric([c, label], row["stretch"])


def _add_crawl(fam: Families, snap: CrawlSnapshot, labeller: SiteLabeller) -> None:
    """The crawl-wide families: dead letters, counters, sites and indexes."""
    c = snap.crawl
    fam["streams_sched_dead_letters"].add_metric([c], snap.dead_letters)
    fam["streams_sched_dead_lettered"].add_metric([c], snap.stat("dead"))
    fam["streams_sched_reclaimed"].add_metric([c], snap.stat("reclaimed"))
    fam["streams_sched_duplicates"].add_metric([c], snap.stat("duplicates"))
    fam["streams_sched_timeouts"].add_metric([c], snap.stat("timeouts"))
    fam["streams_sched_backoffs"].add_metric([c], snap.stat("backoffs"))
    paused = snap.paused_count
    fam["streams_sched_sites"].add_metric([c, "active"], max(0, snap.site_count - paused))
    fam["streams_sched_sites"].add_metric([c, "paused"], paused)
    fam["streams_sched_sites_unlabelled"].add_metric([c], labeller.unlabelled(snap))
    fam["streams_sched_monitor_sites_read"].add_metric([c], len(snap.sites))
    if snap.shards is not None:
        for index, count in (("ready_http", snap.shards.ready_http), ("ready_browser", snap.shards.ready_browser),
                             ("leased", snap.shards.leased)):
            fam["streams_sched_indexed_sites"].add_metric([c, index], count)
    if snap.seen_estimate is not None:
        fam["streams_sched_seen_estimate"].add_metric([c], snap.seen_estimate)


def _add_nodes(fam: Families, c: str, crawl_states: Mapping[str, NodeState]) -> None:
    """Nodes and local requests by state, and the browser families of each live browser node."""
    for state in (ALIVE, DEAD):
        fam["streams_sched_nodes"].add_metric([c, state], sum(1 for n in crawl_states.values() if n.state == state))
        fam["streams_sched_local_requests"].add_metric(
            [c, state], sum(_count(n.info.get("local")) for n in crawl_states.values() if n.state == state)
        )
    for n in crawl_states.values():
        cap = _count(n.info.get("browser_max"))
        if n.state != ALIVE or not cap:
            continue  # one sample per live browser node: the label count follows the fleet
        fam["streams_sched_node_browser_leases"].add_metric([c, n.node], _count(n.info.get("browser")))
        fam["streams_sched_node_browser_max"].add_metric([c, n.node], cap)
        fam["streams_sched_node_renders"].add_metric([c, n.node], _count(n.info.get("renders")))
        fam["streams_sched_node_render_seconds"].add_metric([c, n.node], _duration_s(n.info.get("render_s")))


def _blank_row() -> dict[str, Any]:
    return {"bands": dict.fromkeys(BANDS, 0), "pending": 0, "oldest": 0.0, "delayed": 0, "enqueued": 0, "acked": 0,
            "throttled": 0, "over_cap": 0, "tracked": 0, "revisits": 0, "changed": 0, "unchanged": 0, "overdue": 0,
            "oldest_overdue": 0.0, "overdue_intervals": 0.0, "demand": 0.0, "stretch": 1.0}


def build_server_families(servers: Sequence[ServerMemory]) -> list[Metric]:
    """The Redis servers' families: evictions, memory, limit and policy of each master."""
    fam = {name: _family(name) for name in SERVER_FAMILIES}
    for sm in servers:
        fam["streams_sched_redis_evicted_keys"].add_metric([sm.server], sm.evicted_keys)
        fam["streams_sched_redis_used_memory_bytes"].add_metric([sm.server], sm.used_memory)
        fam["streams_sched_redis_maxmemory_bytes"].add_metric([sm.server], sm.maxmemory)
        fam["streams_sched_redis_maxmemory_policy"].add_metric([sm.server, sm.policy], 1)
    return list(fam.values()) if servers else []


class FrontierCollector:
    """A prometheus-client collector that reads Redis (through the monitor's cache) on scrape."""

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        view = self.monitor.view(self.monitor.settings.cache_s)
        up = GaugeMetricFamily("streams_sched_redis_up", FAMILIES["streams_sched_redis_up"][2])
        up.add_metric([], 1.0 if view.ok else 0.0)
        yield up
        took = GaugeMetricFamily("streams_sched_monitor_read_seconds", FAMILIES["streams_sched_monitor_read_seconds"][2])
        took.add_metric([], view.read_s)
        yield took
        if view.ok:
            yield from build_families(view.snaps, view.states, self.monitor.labeller, view.scaling)
            yield from build_server_families(view.servers)


def _duration_s(value: Any) -> float:
    """Seconds from a node record (absent, or not a number: 0)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.0


def _count(value: Any) -> int:
    """A count from a node record (absent, or written by an older worker: 0)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
