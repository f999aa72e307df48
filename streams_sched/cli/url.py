"""``streams-sched url``: where each URL is in a crawl, and why."""

from __future__ import annotations

import json
from typing import Any

import click

from streams_sched.cli.formatting import format_age
from streams_sched.cli.options import CliError, connect, known_crawl, load_fingerprinter, shared_options
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import validate_site_name

__all__ = ["describe", "url"]


def _in(ms: int, now_ms: int) -> str:
    delta = ms - now_ms
    return f"in {format_age(delta)}" if delta >= 0 else f"{format_age(-delta)} ago"


def describe(report: Any) -> list[str]:
    """The lines ``url`` prints for one URL's report (transfer/finding.py's UrlReport)."""
    r = report
    now = r.now_ms
    lines = [r.url if r.url == r.request_url else f"{r.url} (as Scrapy has it: {r.request_url})",
             f"  site {r.site}, fingerprint {r.fingerprint}"]
    if r.seen is None or (not r.seen and r.seen_by == ""):
        lines.append("  seen: no (the crawl has no such site)")
    elif r.seen:
        sure = "certain: an exact set" if r.seen_by == "exact" else \
            f"a Bloom filter: a URL never seen says yes at most {r.error_rate:g} of the time"
        lines.append(f"  seen: yes ({sure})")
    else:
        lines.append("  seen: no (certain)")
    for p in r.places:
        request = f"{p.method} {p.callback or 'parse'}" + (f", priority {p.priority}" if p.priority else "")
        if p.state == "queued":
            ahead = f", {p.ahead} ahead of it in its stream" if p.ahead is not None else " (in its site's inbox)"
            when = "now" if p.site_ready_ms <= now else _in(p.site_ready_ms, now)
            lines.append(f"  queued: {p.queue}{ahead}; its site may be leased {when} ({request})")
        elif p.state == "leased":
            expires = f"; the lease expires {_in(p.lease_expires_ms, now)}" if p.lease_expires_ms else ""
            lines.append(f"  leased: by {p.node} for {format_age(p.leased_ms_ago)}, delivery {p.deliveries}{expires}"
                         f" ({request})")
        elif p.state in ("delayed", "tracked"):
            extra = f"; every {p.interval_s:g}s" if p.interval_s else ""
            extra += f", {p.failures} failure(s) in a row" if p.failures else ""
            lines.append(f"  {p.state}: due {_in(p.due_ms, now)}: {p.why}{extra} ({request})")
        elif p.state == "dead":
            lines.append(f"  dead letter: {p.reason!r}, after {p.deliveries} deliveries on {p.node or '?'},"
                         f" {_in(p.dead_at_ms, now)} ({request})")
    lines.append(f"  => {r.verdict}")
    lines.append(f"  cost: {r.calls} call(s), {r.entries_read} entries read")
    return lines


@click.command()
@shared_options
@click.argument("urls", nargs=-1, required=True)
@click.option("--site", default=None, help="Look in this site (default: the URL's host, or domain with site_key domain).")
@click.option("--fingerprinter", default=None, metavar="IMPORT.PATH",
              help="The project's REQUEST_FINGERPRINTER_CLASS, if it changes Scrapy's.")
@click.option("--chunk", default=1000, show_default=True, type=click.IntRange(10, 10_000),
              help="Entries one read takes at most.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per URL.")
def url(redis_url: str, crawl: str, urls: tuple[str, ...], site: str | None, fingerprinter: str | None, chunk: int,
        as_json: bool) -> None:
    """Where each URL is: never seen, seen (and how sure), queued, leased, delayed, tracked,
    dead-lettered, or done, and why. Reads the URL's site only, a chunk at a time."""
    if site is not None:
        try:
            validate_site_name(site)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--site") from None
    fingerprint = load_fingerprinter(fingerprinter) if fingerprinter else None
    client = connect(redis_url)
    known_crawl(client, crawl, redis_url)
    from streams_sched.transfer.finding import find_url

    frontier = Frontier(client, crawl, crawl_bloom(client, crawl))
    for u in urls:
        try:
            report = find_url(frontier, u, fingerprinter=fingerprint, site=site, chunk=chunk)
        except ValueError as exc:
            raise CliError(f"{u}: {exc}") from None
        if as_json:
            click.echo(json.dumps(report.as_dict(), sort_keys=True))
        else:
            click.echo("\n".join(describe(report)))
