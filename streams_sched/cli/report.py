"""The status report of a crawl, shared by ``status``, ``watch``, ``crawls`` and the demo:
reading it, sorting the rows, totals and the summary line.

A crawl may have a million sites, most of them idle, so a report does not run the status
script on every site. It reads the shards' figures (registered sites, sites with work
ready, sites with leases, requests ever enqueued: a few commands per shard) and one row
for each site the shards' indexes name, the ``top`` first of them (leased sites by their
oldest lease, then ready sites by when they may be leased). While the indexes name no
more than ``top`` sites the rows hold every site with backlog, leases or delayed
requests, so backlog, pending and delayed are the crawl's, and what is finished is what
was enqueued less what is left. ``all_sites`` reads a row for every registered site
instead (the crawl-wide acked, dead letter and rate figures need that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streams_sched.cli.formatting import Column, format_age, format_rate, format_until, used_columns
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.indexes import ShardSizes, indexed_sites, shard_sizes
from streams_sched.frontier.keys import BANDS
from streams_sched.frontier.records import SiteStatus
from streams_sched.politeness.rates import ack_rate_per_s

__all__ = ["CORE_COLUMNS", "DEFAULT_TOP", "Report", "SORT_KEYS", "STATUS_COLUMNS", "freshness_lines", "read_report", "sort_rows",
           "status_rows", "summary_line", "table_columns", "totals"]

#: sites with work a report reads a row for, unless told otherwise (--top)
DEFAULT_TOP = 1000


def status_rows(statuses: list[SiteStatus]) -> list[dict[str, Any]]:
    """One row per site: backlog by band, leases, delayed, dead letters, counters, rate and
    limit (the effective rate status.lua computed)."""
    rows = []
    for st in statuses:
        row: dict[str, Any] = {"site": st.site}
        for band in BANDS:
            row[band] = sum(s.backlog for (t, b), s in st.streams.items() if b == band and t == "http")
        row["browser"] = sum(s.backlog for (t, _), s in st.streams.items() if t == "browser")
        row["backlog"] = st.backlog
        row["pending"] = st.pending
        row["oldest_lease_ms"] = st.oldest_pending_ms
        row["delayed"] = st.delayed
        row["dead"] = st.dead_letters
        row["enqueued"] = st.stats.get("enqueued", 0)
        row["acked"] = st.stats.get("acked", 0)
        row["rate_per_s"] = round(ack_rate_per_s(st.stats, st.now_ms), 3)
        row["paused"] = st.policy.get("paused") == "1"
        eff = st.rate
        row["limit_per_s"] = round(eff.rate, 3)
        row["limit_reason"] = eff.reason
        row["paused_until_ms"] = eff.paused_until_ms
        row["robots_delay_s"] = float(st.policy.get("robots_delay") or 0)
        row["max_pages"] = int(st.policy.get("max_pages") or 0)
        row["over_cap"] = st.stats.get("over_cap", 0)
        row["throttled"] = st.stats.get("throttled", 0)
        row["tracked"] = st.stats.get("tracked", 0)
        row["revisits"] = st.stats.get("revisits", 0)
        row["changed"] = st.stats.get("changed", 0)
        row["unchanged"] = st.stats.get("unchanged", 0)
        row["overdue"] = st.overdue
        row["oldest_overdue_ms"] = int(st.oldest_overdue_s * 1000) if st.overdue else -1
        row["overdue_intervals"] = round(st.overdue_ratio, 2)
        row["revisit_demand_per_s"] = round(st.revisit_demand_per_s, 4)
        row["revisit_stretch"] = round(st.revisit_stretch, 3)
        rows.append(row)
    return rows


STATUS_COLUMNS: list[Column] = [
    ("site", "SITE", str),
    ("high", "HIGH", str),
    ("default", "DEFAULT", str),
    ("low", "LOW", str),
    ("browser", "BROWSER", str),
    ("pending", "PENDING", str),
    ("oldest_lease_ms", "OLDEST LEASE", format_age),
    ("delayed", "DELAYED", str),
    ("dead", "DEAD", str),
    ("enqueued", "ENQUEUED", str),
    ("acked", "ACKED", str),
    ("rate_per_s", "RATE 1M", format_rate),
    ("limit_per_s", "LIMIT", lambda v: format_rate(v) if v > 0 else "-"),
    ("limit_reason", "WHY", str),
    ("paused_until_ms", "PAUSED UNTIL", format_until),
    ("throttled", "429/503", str),
    ("over_cap", "OVER CAP", str),
    ("tracked", "TRACKED", str),
    ("revisits", "REVISITS", str),
    ("changed", "CHANGED", str),
    ("overdue", "OVERDUE", str),
    ("oldest_overdue_ms", "OLDEST OVERDUE", format_age),
    ("paused", "PAUSED", lambda p: "yes" if p else ""),
]

#: the columns `status` and `watch` print whatever the rows hold; the others only when a row
#: of the table has something in them (--all and --json show every one)
CORE_COLUMNS = ("site", "default", "pending", "delayed", "dead", "enqueued", "acked", "rate_per_s", "limit_per_s",
                "limit_reason")



def table_columns(rows: list[dict[str, Any]], all_columns: bool = False) -> list[Column]:
    """The status table's columns: every one with ``all_columns`` (``--all``), else the core
    ones and those a row of the table has something in (revisits, browser, throttling ...
    when the crawl uses them)."""
    return list(STATUS_COLUMNS) if all_columns else used_columns(rows, STATUS_COLUMNS, CORE_COLUMNS)[0]


#: --sort keys: row field, largest first (site: alphabetical)
SORT_KEYS = ("site", "backlog", "pending", "oldest", "delayed", "dead", "rate")
SORT_FIELDS = {"oldest": "oldest_lease_ms", "rate": "rate_per_s"}


def sort_rows(rows: list[dict[str, Any]], key: str, limit: int) -> list[dict[str, Any]]:
    """Rows by one of SORT_KEYS, the first ``limit`` of them (0 = all)."""
    if key == "site":
        rows = sorted(rows, key=lambda r: r["site"])
    else:
        name = SORT_FIELDS.get(key, key)
        rows = sorted(rows, key=lambda r: (-r[name], r["site"]))
    return rows[:limit] if limit > 0 else rows


def totals(rows: list[dict[str, Any]], report: Report | None = None) -> dict[str, Any]:
    """The crawl's totals: sums over the rows (the oldest lease is the maximum), and with
    ``report`` the shards' figures: registered sites, sites in the indexes, enqueued, and
    ``done`` = enqueued less what is left (when the rows are not every site's)."""
    keys = ("high", "default", "low", "browser", "backlog", "pending", "delayed", "dead", "enqueued", "acked",
            "throttled", "over_cap", "tracked", "revisits", "changed", "unchanged", "overdue")
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    out["oldest_overdue_ms"] = max((r["oldest_overdue_ms"] for r in rows), default=-1)
    out["overdue_intervals"] = max((r["overdue_intervals"] for r in rows), default=0.0)
    out["revisit_demand_per_s"] = round(sum(r["revisit_demand_per_s"] for r in rows), 4)
    out["rate_per_s"] = round(sum(r["rate_per_s"] for r in rows), 3)
    out["oldest_lease_ms"] = max((r["oldest_lease_ms"] for r in rows), default=-1)
    out["paused"] = sum(1 for r in rows if r["paused"])
    out["sites"] = len(rows)
    out["done"] = out["acked"] + out["dead"]
    if report is not None:
        sh = report.shards
        out["sites"] = sh.sites
        out["rows"] = len(rows)
        out["ready_http"], out["ready_browser"], out["leased_sites"] = sh.ready_http, sh.ready_browser, sh.leased
        out["complete"] = report.complete
        out["all_sites"] = report.all_sites
        if not report.all_sites:
            out["enqueued"] = sh.enqueued
            out["done"] = max(0, sh.enqueued - (out["backlog"] + out["pending"] + out["delayed"]))
    return out


def summary_line(t: dict[str, Any]) -> str:
    """One line of the totals, under the table."""
    paused = f" ({t['paused']} paused)" if t["paused"] else ""
    line = (
        f"{t['sites']} site(s){paused}; backlog {t['backlog']}, pending {t['pending']}"
        f" (oldest {format_age(t['oldest_lease_ms'])}), delayed {t['delayed']}, dead letters {t['dead']},"
        f" acked {t['acked']}/{t['enqueued']}, rate {format_rate(t['rate_per_s'])} over the last minute"
    )
    if "rows" not in t or t["all_sites"]:
        return line
    line = (
        f"{t['sites']} site(s), {t['ready_http'] + t['ready_browser']} with work ready (http {t['ready_http']},"
        f" browser {t['ready_browser']}), {t['leased_sites']} with leases; backlog {t['backlog']}, pending"
        f" {t['pending']} (oldest {format_age(t['oldest_lease_ms'])}), delayed {t['delayed']};"
        f" finished {t['done']}/{t['enqueued']}"
    )
    if not t["complete"]:
        line += f" (the {t['rows']} site(s) read of more with work: figures are partial; --top or --all)"
    return line + "; dead letters, acks and rate of these sites only (--all: every site)"


def freshness_lines(t: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """What continuous crawling looks like, under the summary: pages tracked, overdue and
    how late, the share of revisits that found a change, and each site whose tracked pages
    need more fetches than its rate allows (their revisits are stretched to fit)."""
    if not (t["tracked"] or t["overdue"]):
        return []
    line = f"tracked {t['tracked']} page(s), needing {format_rate(t['revisit_demand_per_s'])}; overdue {t['overdue']}"
    if t["overdue"]:
        line += f" (oldest {format_age(t['oldest_overdue_ms'])}"
        if t["overdue_intervals"]:
            line += f", {t['overdue_intervals']:.1f} of its interval(s) late"
        line += ")"
    compared = t["changed"] + t["unchanged"]
    if compared:
        line += f"; adaptive revisits found a change in {100 * t['changed'] / compared:.0f}% ({t['changed']}/{compared})"
    out = [line]
    for r in sorted(rows, key=lambda r: -r["revisit_stretch"]):
        if r["revisit_stretch"] <= 1:
            break
        budget = r["revisit_demand_per_s"] / r["revisit_stretch"]
        out.append(
            f"site {r['site']}: its tracked pages need {format_rate(r['revisit_demand_per_s'])}, its revisit budget is"
            f" {format_rate(budget)} (rate {format_rate(r['limit_per_s'])} x STREAMS_REVISIT_BUDGET_SHARE): every"
            f" revisit is stretched x{r['revisit_stretch']:.2f}; raise its rate or lengthen its pages' intervals"
        )
    return out


@dataclass
class Report:
    """What a report read: one row per site read, and the shards' figures summed."""

    rows: list[dict[str, Any]]
    shards: ShardSizes = field(default_factory=ShardSizes)
    #: the rows hold every site with work (or every site, with ``all_sites``)
    complete: bool = True
    all_sites: bool = False

    @property
    def drained(self) -> bool:
        """Nothing left: no backlog, lease or delayed request on any site."""
        return self.complete and not any(r["backlog"] or r["pending"] or r["delayed"] for r in self.rows)


def _rows_of(frontier: Frontier, sites: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(0, len(sites), 500):
        rows += status_rows(frontier.status_many(sites[i : i + 500]))
    return rows


def read_report(frontier: Frontier, top: int = DEFAULT_TOP, all_sites: bool = False) -> Report:
    """The shards' figures and the rows of the ``top`` first sites the indexes name (every
    registered site with ``all_sites``), 500 sites per round trip."""
    sizes = ShardSizes()
    for part in shard_sizes(frontier):
        sizes.add(part)
    frontier.use_crawl_defaults(frontier.crawl_meta())  # the sites' rates count the crawl's defaults in
    if all_sites:
        return Report(_rows_of(frontier, frontier.sites()), sizes, True, True)
    indexed = indexed_sites(frontier, top)
    named = indexed.sites
    rows = _rows_of(frontier, named[:top])
    return Report(rows, sizes, complete=not indexed.truncated and len(named) <= top)
