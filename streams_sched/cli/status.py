"""``streams-sched status`` and ``watch``: the per-site table, once or refreshed live
with a progress line (finished / enqueued, rate and ETA) for a draining crawl.

Both read the shards' figures and a row per site with work, at most ``--top`` of them
(report.py), so they cost the same on a crawl of a million mostly idle sites; ``--all``
reads a row for every registered site."""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from typing import Any

import click

from streams_sched.cli.formatting import format_duration, format_rate, render_table
from streams_sched.cli.options import connect, known_crawl, shared_options
from streams_sched.cli.report import (
    DEFAULT_TOP,
    SORT_KEYS,
    freshness_lines,
    read_report,
    sort_rows,
    summary_line,
    table_columns,
    totals,
)
from streams_sched.exit_codes import EXIT_INTERRUPTED, EXIT_TIMEOUT

__all__ = ["Progress", "progress_line", "status", "top_options", "watch"]


def top_options(func: Any) -> Any:
    """--top and --all: how many sites a report reads a row for."""
    func = click.option("--all", "all_sites", is_flag=True,
                        help="A row for every registered site (reads each one: slow on a crawl of many sites),"
                             " and every column, also those with nothing in them.")(func)
    return click.option("--top", type=click.IntRange(min=1), default=DEFAULT_TOP, show_default=True,
                        help="Rows for at most this many sites with work (leases first, then ready sites).")(func)


@click.command()
@shared_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--sort", "sort_key", type=click.Choice(SORT_KEYS), default="site", show_default=True, help="Order of the rows (largest first, except site).")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=0, help="Show only the first N rows (0 = all); totals cover every row read.")
@top_options
def status(redis_url: str, crawl: str, as_json: bool, sort_key: str, limit: int, top: int, all_sites: bool) -> None:
    """The crawl's totals (sites, sites with work, enqueued, finished) and, per site with
    work (the columns with nothing in them left out, unless --all): backlog by band, pending leases, oldest lease age, delayed, dead letters, the ack
    rate over the last minute, the rate limit in force and why (policy, robots, backoff,
    retry-after, paused, unlimited), until when a Retry-After pauses it, 429/503 answers,
    requests dropped over its page cap, and with continuous crawling the pages tracked,
    overdue and how late, and the sites whose revisits are stretched to fit their rate."""
    client = connect(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    report = read_report(frontier, top, all_sites)
    rows = report.rows
    shown = sort_rows(rows, sort_key, limit)
    t = totals(rows, report)
    if as_json:
        click.echo(json.dumps({"crawl": crawl, "totals": t, "sites": shown}, indent=2))
        return
    click.echo(render_table(shown, table_columns(shown, all_sites)))
    more = f" ({len(rows) - len(shown)} more not shown)" if len(shown) < len(rows) else ""
    click.echo(f"\n{summary_line(t)}{more}")
    for line in freshness_lines(t, rows):
        click.echo(line)


class Progress:
    """Finished-request counts over time, for a rate and an ETA (pure)."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, done: int) -> None:
        self.samples.append((t, done))
        while len(self.samples) > 2 and t - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def rate(self) -> float | None:
        """Finished requests per second over the window, None until two samples."""
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 > t0 else None


def progress_line(t: dict[str, Any], rate: float, width: int = 24) -> str:
    """One line: a bar of finished / enqueued, what is left, the rate and an ETA."""
    # "done" from report.totals (enqueued less what is left); else acked + dead letters
    done = t.get("done", t["acked"] + t["dead"])
    total = max(t["enqueued"], done)
    left = t["backlog"] + t["pending"] + t["delayed"]
    frac = done / total if total else 1.0
    filled = min(width, int(frac * width))
    bar = "#" * filled + "-" * (width - filled)
    if left == 0:
        eta = "drained"
    elif rate > 0:
        eta = f"ETA {format_duration(left / rate)}"
    else:
        eta = "ETA -"
    return (
        f"[{bar}] {frac * 100:5.1f}%  done {done}/{total}  left {left}"
        f" (backlog {t['backlog']}, pending {t['pending']}, delayed {t['delayed']})"
        f"  {format_rate(rate)}  {eta}"
    )


@click.command()
@shared_options
@click.option("--interval", "-i", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--sort", "sort_key", type=click.Choice(SORT_KEYS), default="backlog", show_default=True)
@click.option("--limit", "-n", type=click.IntRange(min=0), default=20, show_default=True, help="Sites shown (0 = all).")
@click.option("--until-drained", is_flag=True, help="Exit 0 once nothing is left (no backlog, lease or delayed request).")
@click.option("--timeout", type=click.FloatRange(min=0), default=0, help="With --until-drained: give up after this many seconds (exit 4).")
@click.option("--progress-only", is_flag=True, help="Print only the progress line, one per refresh (for logs).")
@top_options
def watch(redis_url: str, crawl: str, interval: float, sort_key: str, limit: int, until_drained: bool, timeout: float,
          progress_only: bool, top: int, all_sites: bool) -> None:
    """The status table, refreshed live, with a progress line for a draining crawl."""
    client = connect(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    tty = sys.stdout.isatty()
    progress = Progress()
    started = time.monotonic()
    try:
        while True:
            report = read_report(frontier, top, all_sites)
            rows = report.rows
            t = totals(rows, report)
            now = time.monotonic()
            progress.add(now, t["done"])
            rate = progress.rate()
            line = progress_line(t, t["rate_per_s"] if rate is None else rate)
            if progress_only:
                click.echo(line)
            else:
                shown = sort_rows(rows, sort_key, limit)
                frame = (
                    f"crawl {crawl} - {time.strftime('%H:%M:%S')} - every {interval:g}s\n\n"
                    f"{render_table(shown, table_columns(shown, all_sites))}\n\n"
                    f"{summary_line(t)}\n{line}"
                )
                click.echo(("\x1b[H\x1b[2J" if tty else "\n") + frame)
            left = t["backlog"] + t["pending"] + t["delayed"]
            if until_drained and report.drained:
                click.echo(f"crawl {crawl} is drained")
                return
            if until_drained and timeout and now - started >= timeout:
                click.echo(f"error: crawl {crawl} not drained after {timeout:g}s ({left} left)", err=True)
                sys.exit(EXIT_TIMEOUT)
            time.sleep(interval)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
