"""The ``streams-sched`` command line: seed, inspect, operate and clean up crawls.

Every command takes ``--redis-url`` (env ``REDIS_URL``) and most take
``--crawl`` (env ``STREAMS_PREFIX``). Errors are one line on stderr starting
with ``error:``. Exit codes, for scripts:

    0    success
    1    runtime error: unknown crawl or site, Redis refused a command, ...
    2    usage error: bad option or argument
    3    Redis unreachable (or the credentials were refused)
    4    ``watch --until-drained --timeout``: not drained in time
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click
import redis

from .connection import connect_ready, redact
from .errors import RedisUnavailable, StreamsSchedError
from .exit_codes import EXIT_ERROR, EXIT_UNREACHABLE
from .frontier import Frontier, SiteStatus
from .keys import BANDS, validate_crawl_name, validate_site_name
from .politeness import effective_rate
from .rates import ack_rate_per_s

__all__ = ["main"]


class CliError(click.ClickException):
    """An error a script can rely on: one ``error:`` line on stderr and a documented exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _client(url: str) -> Any:
    """A client whose Redis answered within STREAMS_CONNECT_TIMEOUT_SECONDS (default 3)."""
    try:
        timeout_s = float(os.environ.get("STREAMS_CONNECT_TIMEOUT_SECONDS", "3"))
    except ValueError:
        timeout_s = 3.0
    return connect_ready(url, timeout_s, setting="--redis-url", quiet=True)


def known_crawl(client: Any, crawl: str, redis_url: str) -> Frontier:
    """The crawl's Frontier, or a CliError if no such crawl is registered."""
    frontier = Frontier(client, crawl)
    if not client.sismember("ss:crawls", crawl) and not client.exists(frontier.keys.sites):
        raise CliError(f"no crawl named {crawl!r} in {redact(redis_url)} (see: streams-sched crawls)")
    return frontier


def shared_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url and --crawl for every command that works on one crawl."""

    @click.option("--redis-url", envvar="REDIS_URL", default="redis://localhost:6379/0", show_default=True, help="Redis of the frontier (env REDIS_URL).")
    @click.option("--crawl", "-c", envvar="STREAMS_PREFIX", required=True, help="Crawl namespace (STREAMS_PREFIX; usually the spider name).")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            validate_crawl_name(kwargs["crawl"], "--crawl")
        except StreamsSchedError as exc:
            raise click.BadParameter(str(exc), param_hint="--crawl") from None
        return handle_errors(func)(*args, **kwargs)

    return wrapper


def redis_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url for commands that are not about one crawl."""

    @click.option("--redis-url", envvar="REDIS_URL", default="redis://localhost:6379/0", show_default=True, help="Redis of the frontier (env REDIS_URL).")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handle_errors(func)(*args, **kwargs)

    return wrapper


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's and Redis' errors into one line and a documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RedisUnavailable as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None
        except StreamsSchedError as exc:
            raise CliError(str(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise CliError(f"lost the connection to Redis: {exc}", EXIT_UNREACHABLE) from None
        except redis.ResponseError as exc:
            raise CliError(f"Redis refused: {exc}") from None

    return wrapper


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
    from .seeding import Seeder

    added = dups = 0
    try:
        seeder = Seeder(client, crawl)
        batch: list[str] = []
        for source in sources:
            for line in source:
                batch.append(line)
                if len(batch) >= seeder.batch:
                    result = seeder.seed(batch, priority=priority, site=site, callback=callback, dont_filter=dont_filter)
                    added, dups, batch = added + len(result.added), dups + len(result.duplicates), []
        result = seeder.seed(batch, priority=priority, site=site, callback=callback, dont_filter=dont_filter)
        added, dups = added + len(result.added), dups + len(result.duplicates)
    except ValueError as exc:
        raise CliError(f"{exc} (pushed {added} request(s) before it)") from None
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


def _rate(v: float) -> str:
    if v <= 0:
        return "0"
    return f"{v:.1f}/s" if v < 100 else f"{v:.0f}/s"


def _until(ms: int) -> str:
    if ms <= 0:
        return ""
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000 // 100}Z"


def status_rows(statuses: list[SiteStatus], default_rate: float = 0.0) -> list[dict[str, Any]]:
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


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, Callable[[Any], str]]]) -> str:
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
    ("rate_per_s", "RATE 1M", _rate),
    ("limit_per_s", "LIMIT", lambda v: _rate(v) if v > 0 else "-"),
    ("limit_reason", "WHY", str),
    ("paused_until_ms", "PAUSED UNTIL", _until),
    ("throttled", "429/503", str),
    ("over_cap", "OVER CAP", str),
    ("paused", "PAUSED", lambda p: "yes" if p else ""),
]

#: --sort keys: row field, largest first (site: alphabetical)
SORT_KEYS = ("site", "backlog", "pending", "oldest", "delayed", "dead", "rate")
_SORT_FIELD = {"oldest": "oldest_lease_ms", "rate": "rate_per_s"}


def sort_rows(rows: list[dict[str, Any]], key: str, limit: int) -> list[dict[str, Any]]:
    if key == "site":
        rows = sorted(rows, key=lambda r: r["site"])
    else:
        name = _SORT_FIELD.get(key, key)
        rows = sorted(rows, key=lambda r: (-r[name], r["site"]))
    return rows[:limit] if limit > 0 else rows


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("high", "default", "low", "browser", "backlog", "pending", "delayed", "dead", "enqueued", "acked",
            "throttled", "over_cap")
    out: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    out["rate_per_s"] = round(sum(r["rate_per_s"] for r in rows), 3)
    out["oldest_lease_ms"] = max((r["oldest_lease_ms"] for r in rows), default=-1)
    out["paused"] = sum(1 for r in rows if r["paused"])
    out["sites"] = len(rows)
    return out


def summary_line(t: dict[str, Any]) -> str:
    paused = f" ({t['paused']} paused)" if t["paused"] else ""
    return (
        f"{t['sites']} site(s){paused}; backlog {t['backlog']}, pending {t['pending']}"
        f" (oldest {_age(t['oldest_lease_ms'])}), delayed {t['delayed']}, dead letters {t['dead']},"
        f" acked {t['acked']}/{t['enqueued']}, rate {_rate(t['rate_per_s'])} over the last minute"
    )


def read_rows(frontier: Frontier) -> list[dict[str, Any]]:
    sites = frontier.sites()
    rows: list[dict[str, Any]] = []
    try:
        default_rate = float(frontier.client.hget(frontier.keys.meta, "default_rate") or 0)
    except ValueError:
        default_rate = 0.0
    for i in range(0, len(sites), 500):
        rows += status_rows(frontier.status_many(sites[i : i + 500]), default_rate)
    return rows


@main.command()
@shared_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--sort", "sort_key", type=click.Choice(SORT_KEYS), default="site", show_default=True, help="Order of the rows (largest first, except site).")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=0, help="Show only the first N sites (0 = all); totals cover every site.")
def status(redis_url: str, crawl: str, as_json: bool, sort_key: str, limit: int) -> None:
    """Per site: backlog by band, pending leases, oldest lease age, delayed,
    dead letters, the ack rate over the last minute, the rate limit in force and
    why (policy, robots, backoff, retry-after, paused, unlimited), until when a
    Retry-After pauses it, 429/503 answers and requests dropped over its page cap."""
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    rows = read_rows(frontier)
    shown = sort_rows(rows, sort_key, limit)
    t = totals(rows)
    if as_json:
        click.echo(json.dumps({"crawl": crawl, "totals": t, "sites": shown}, indent=2))
        return
    click.echo(render_table(shown, STATUS_COLUMNS))
    more = f" ({len(rows) - len(shown)} more not shown)" if len(shown) < len(rows) else ""
    click.echo(f"\n{summary_line(t)}{more}")


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


@main.group()
def site() -> None:
    """Per-site policy: rate limit, weight, task type, browser cap, page cap, pause."""


@site.command("set")
@shared_options
@click.argument("name")
@click.option("--rate", type=float, help="Requests per second for the whole crawl (all workers); 0 = no limit.")
@click.option("--burst", type=float, help="Tokens the bucket holds (default: the rate).")
@click.option("--weight", type=float, help="Share of fetches when several sites have work (default 1).")
@click.option("--task-type", type=click.Choice(["http", "browser"]), help="Default task type of the site's requests.")
@click.option("--max-browser", type=int, help="Most browser requests of this site in flight on one node.")
@click.option("--paused/--resumed", default=None, help="Stop or restart leasing the site.")
@click.option("--max-pages", type=int, help="Most requests of the site accepted in all, all workers together; 0 = no cap.")
def site_set(redis_url: str, crawl: str, name: str, rate: float | None, burst: float | None, weight: float | None,
             task_type: str | None, max_browser: int | None, paused: bool | None, max_pages: int | None) -> None:
    """Change a site's policy (NAME "*" = the default for sites without their own).

    Workers pick it up within STREAMS_POLICY_REFRESH_SECONDS (the site's own policy on
    their next lease of it, at once)."""
    from .policy import set_policy

    fields = {k: v for k, v in {"rate": rate, "burst": burst, "weight": weight, "task_type": task_type,
                                "max_browser": max_browser, "paused": paused, "max_pages": max_pages}.items()
              if v is not None}
    if not fields:
        raise click.UsageError(
            "give at least one of --rate --burst --weight --task-type --max-browser --max-pages --paused/--resumed"
        )
    frontier = Frontier(_client(redis_url), crawl)
    try:
        stored = set_policy(frontier, name, fields)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    click.echo(f"{name}: " + " ".join(f"{k}={v}" for k, v in sorted(stored.items())))


@site.command("show")
@shared_options
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def site_show(redis_url: str, crawl: str, name: str | None, as_json: bool) -> None:
    """Show the policy of one site, or of every site with one, and the default ("*")."""
    from .policy import POLICY_FIELDS, get_policy

    frontier = Frontier(_client(redis_url), crawl)
    names = [name] if name else ["*", *frontier.sites()]
    policies = {n: get_policy(frontier, n) for n in names}
    if as_json:
        click.echo(json.dumps(policies, indent=2, sort_keys=True))
        return
    columns = [("site", "SITE", str)] + [(f, f.upper(), str) for f in POLICY_FIELDS]
    rows = [{"site": n, **{f: p.get(f, "-") for f in POLICY_FIELDS}} for n, p in policies.items() if p or n == "*" or name]
    click.echo(render_table(rows, columns))


from . import cli_ops  # noqa: E402,F401  (registers watch, dlq, pause, resume, nodes, crawls)

if __name__ == "__main__":  # pragma: no cover
    main()
