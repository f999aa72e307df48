"""The ``streams-sched`` command line: seed, inspect and clean up crawls.

Every command takes ``--redis-url`` (env ``REDIS_URL``) and most take
``--crawl`` (env ``STREAMS_PREFIX``). Exit codes: 0 success, 1 a runtime error
(Redis unreachable, unknown crawl, ...), 2 a usage error. Errors are one line
on stderr starting with ``error:``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import click
import msgpack
from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter

from .codec import RequestCodec
from .connection import connect_ready, redact
from .errors import StreamsSchedError
from .frontier import Frontier, Outgoing, SiteStatus, crawl_bloom
from .keys import BANDS, validate_crawl_name, validate_site_name
from .selection import band_for

__all__ = ["main", "push_urls"]


def _client(url: str) -> Any:
    return connect_ready(url, 5.0, setting="--redis-url")


def shared_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url and --crawl for every command that works on one crawl."""

    @click.option("--redis-url", envvar="REDIS_URL", default="redis://localhost:6379/0", show_default=True, help="Redis of the frontier (env REDIS_URL).")
    @click.option("--crawl", "-c", envvar="STREAMS_PREFIX", required=True, help="Crawl namespace (STREAMS_PREFIX; usually the spider name).")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            validate_crawl_name(kwargs["crawl"], "--crawl")
            return func(*args, **kwargs)
        except StreamsSchedError as exc:
            raise click.ClickException(str(exc)) from None

    return wrapper


def push_urls(
    client: Any,
    crawl: str,
    urls: Iterable[str],
    *,
    priority: int = 0,
    site: str | None = None,
    callback: str | None = None,
    dont_filter: bool = False,
    high_min: int = 1,
    low_max: int = -1,
    batch: int = 500,
) -> tuple[int, int]:
    """Enqueue seed URLs (dedupe applies). Returns (added, duplicates)."""
    bloom = crawl_bloom(client, crawl)
    frontier = Frontier(client, crawl, bloom)
    frontier.scripts.load()
    codec = RequestCodec(None)
    fingerprinter = RequestFingerprinter()
    band = band_for(priority, high_min, low_max)
    by_site: dict[str, list[Outgoing]] = defaultdict(list)
    added = dups = 0

    def flush() -> tuple[int, int]:
        a = d = 0
        pipe = client.pipeline(transaction=False)
        frontier.register_sites(list(by_site), pipe)
        for s, items in by_site.items():
            frontier.enqueue(s, items, pipe)
        for reply in pipe.execute()[1:]:
            a += int(reply[0])
            d += int(reply[1])
        by_site.clear()
        return a, d

    pending = 0
    for raw in urls:
        url = raw.strip()
        if not url or url.startswith("#"):
            continue
        meta = {"site": site} if site else None
        request = Request(url, priority=priority, meta=meta, dont_filter=dont_filter)
        payload = codec.encode(request)
        if callback:
            d = msgpack.unpackb(payload, raw=False)
            d["c"] = callback
            payload = msgpack.packb(d, use_bin_type=True)
        target = site or urlparse_cached(request).hostname or "_nohost"
        validate_site_name(target)
        fp = b"" if dont_filter else fingerprinter.fingerprint(request)
        by_site[target].append(Outgoing(fp, band, 0, payload))
        pending += 1
        if pending >= batch:
            a, d = flush()
            added, dups, pending = added + a, dups + d, 0
    if by_site:
        a, d = flush()
        added, dups = added + a, dups + d
    frontier.register()
    return added, dups


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streams-sched")
def main() -> None:
    """Seed, inspect and clean up streams-sched crawls."""


@main.command()
@shared_options
@click.argument("urls", nargs=-1)
@click.option("--file", "-f", "files", multiple=True, type=click.File("r"), help="Read URLs from a file, one per line ('-' = stdin).")
@click.option("--priority", "-p", default=0, show_default=True, help="Request.priority of the seeds (decides the band).")
@click.option("--site", default=None, help="Put every URL in this site instead of its host.")
@click.option("--callback", default=None, help="Spider method to call (default: parse).")
@click.option("--dont-filter", is_flag=True, help="Skip dedupe.")
def push(redis_url: str, crawl: str, urls: tuple[str, ...], files: tuple[Any, ...], priority: int, site: str | None, callback: str | None, dont_filter: bool) -> None:
    """Add seed URLs to a crawl (arguments, files, or stdin when no URL is given)."""
    sources: list[Iterable[str]] = [urls]
    sources += list(files)
    if not urls and not files:
        if sys.stdin.isatty():
            raise click.UsageError("give URLs as arguments, with --file, or on stdin")
        sources.append(sys.stdin)
    if site:
        try:
            validate_site_name(site)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--site") from None
    if callback and not callback.isidentifier():
        raise click.BadParameter(f"{callback!r} is not a method name", param_hint="--callback")
    client = _client(redis_url)

    def all_urls() -> Iterable[str]:
        for source in sources:
            yield from source

    try:
        added, dups = push_urls(client, crawl, all_urls(), priority=priority, site=site, callback=callback, dont_filter=dont_filter)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"pushed {added} request(s) to crawl {crawl} ({dups} duplicate(s) skipped)")


def _age(ms: int) -> str:
    if ms < 0:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def status_rows(statuses: list[SiteStatus]) -> list[dict[str, Any]]:
    rows = []
    for st in statuses:
        row: dict[str, Any] = {"site": st.site}
        for band in BANDS:
            row[band] = sum(s.backlog for (t, b), s in st.streams.items() if b == band and t == "http")
        row["browser"] = sum(s.backlog for (t, _), s in st.streams.items() if t == "browser")
        row["pending"] = st.pending
        row["oldest_lease_ms"] = st.oldest_pending_ms
        row["delayed"] = st.delayed
        row["dead"] = st.dead_letters
        row["enqueued"] = st.stats.get("enqueued", 0)
        row["acked"] = st.stats.get("acked", 0)
        row["paused"] = st.policy.get("paused") == "1"
        rows.append(row)
    return rows


def render_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Callable[[Any], str]]]) -> str:
    header = [title for _, title, _ in columns]
    body = [[fmt(row[key]) for key, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    for r in body:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


STATUS_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("site", "SITE", str),
    ("high", "HIGH", str),
    ("default", "DEFAULT", str),
    ("low", "LOW", str),
    ("browser", "BROWSER", str),
    ("pending", "PENDING", str),
    ("oldest_lease_ms", "OLDEST LEASE", _age),
    ("delayed", "DELAYED", str),
    ("dead", "DEAD", str),
    ("enqueued", "ENQUEUED", str),
    ("acked", "ACKED", str),
]


@main.command()
@shared_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(redis_url: str, crawl: str, as_json: bool) -> None:
    """Per site: backlog by band, pending leases, oldest lease age, delayed, dead letters."""
    client = _client(redis_url)
    frontier = Frontier(client, crawl)
    sites = frontier.sites()
    if not sites and not client.sismember("ss:crawls", crawl):
        raise click.ClickException(f"no crawl named {crawl!r} in {redact(redis_url)}")
    rows = status_rows(frontier.status_many(sites))
    if as_json:
        click.echo(json.dumps({"crawl": crawl, "sites": rows}, indent=2))
        return
    click.echo(render_table(rows, STATUS_COLUMNS))
    total = {k: sum(r[k] for r in rows) for k in ("high", "default", "low", "browser", "pending", "delayed", "dead")}
    click.echo(
        f"\n{len(rows)} site(s); backlog {total['high'] + total['default'] + total['low'] + total['browser']},"
        f" pending {total['pending']}, delayed {total['delayed']}, dead letters {total['dead']}"
    )


@main.command()
@shared_options
@click.option("--site", default=None, help="Purge only this site.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(redis_url: str, crawl: str, site: str | None, yes: bool) -> None:
    """Delete a crawl (or one site of it) from Redis: backlog, leases, seen filter, dead letters."""
    client = _client(redis_url)
    frontier = Frontier(client, crawl)
    what = f"site {site} of crawl {crawl}" if site else f"crawl {crawl}"
    if not yes:
        click.confirm(f"delete {what} from {redact(redis_url)}?", abort=True)
    if site:
        deleted = int(frontier.purge_site(site))
        client.srem(frontier.keys.sites, site)
    else:
        deleted = frontier.purge()
    click.echo(f"purged {what} ({deleted} key(s) deleted)")


if __name__ == "__main__":  # pragma: no cover
    main()
