"""The status report of a crawl, one row per site, shared by ``status``, ``watch``,
``crawls`` and the demo: reading the rows, sorting them, totals and the summary line."""

from __future__ import annotations

from typing import Any

from ..frontier import Frontier, SiteStatus
from ..keys import BANDS
from ..politeness import effective_rate
from ..rates import ack_rate_per_s
from .formatting import Column, format_age, format_rate, format_until

__all__ = ["SORT_KEYS", "STATUS_COLUMNS", "read_rows", "sort_rows", "status_rows", "summary_line", "totals"]


def status_rows(statuses: list[SiteStatus], default_rate: float = 0.0) -> list[dict[str, Any]]:
    """One row per site: backlog by band, leases, delayed, dead letters, counters, rate and limit."""
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
        eff = effective_rate(st.policy, st.now_ms, default_rate=default_rate)
        row["limit_per_s"] = round(eff.rate, 3)
        row["limit_reason"] = eff.reason
        row["paused_until_ms"] = eff.paused_until_ms
        row["robots_delay_s"] = float(st.policy.get("robots_delay") or 0)
        row["max_pages"] = int(st.policy.get("max_pages") or 0)
        row["over_cap"] = st.stats.get("over_cap", 0)
        row["throttled"] = st.stats.get("throttled", 0)
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
    ("paused", "PAUSED", lambda p: "yes" if p else ""),
]

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


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The crawl's totals over every row (the oldest lease is the maximum)."""
    keys = ("high", "default", "low", "browser", "backlog", "pending", "delayed", "dead", "enqueued", "acked",
            "throttled", "over_cap")
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    out["rate_per_s"] = round(sum(r["rate_per_s"] for r in rows), 3)
    out["oldest_lease_ms"] = max((r["oldest_lease_ms"] for r in rows), default=-1)
    out["paused"] = sum(1 for r in rows if r["paused"])
    out["sites"] = len(rows)
    return out


def summary_line(t: dict[str, Any]) -> str:
    """One line of the totals, under the table."""
    paused = f" ({t['paused']} paused)" if t["paused"] else ""
    return (
        f"{t['sites']} site(s){paused}; backlog {t['backlog']}, pending {t['pending']}"
        f" (oldest {format_age(t['oldest_lease_ms'])}), delayed {t['delayed']}, dead letters {t['dead']},"
        f" acked {t['acked']}/{t['enqueued']}, rate {format_rate(t['rate_per_s'])} over the last minute"
    )


def read_rows(frontier: Frontier) -> list[dict[str, Any]]:
    """The rows of every site of the crawl, 500 sites per round trip."""
    sites = frontier.sites()
    rows: list[dict[str, Any]] = []
    try:
        default_rate = float(frontier.client.hget(frontier.keys.meta, "default_rate") or 0)
    except ValueError:
        default_rate = 0.0
    for i in range(0, len(sites), 500):
        rows += status_rows(frontier.status_many(sites[i : i + 500]), default_rate)
    return rows
