"""Operating commands of ``streams-sched``: watch, dlq, pause, resume, nodes, crawls.

Registered on :data:`streams_sched.cli.main`; exit codes as documented there.
"""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import click

from .cli import (
    STATUS_COLUMNS,
    CliError,
    _age,
    _client,
    _rate,
    known_crawl,
    main,
    read_rows,
    redis_option,
    render_table,
    shared_options,
    sort_rows,
    summary_line,
    totals,
)
from .dlq import DeadLetter, iter_letters, purge_letters, requeue_letters
from .exit_codes import EXIT_TIMEOUT
from .frontier import Frontier
from .keys import validate_site_name
from .liveness import node_states
from .policy import pause_site, resume_site

__all__ = ["Progress", "progress_line"]


# -- watch ---------------------------------------------------------------------


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


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def progress_line(t: dict[str, Any], rate: float, width: int = 24) -> str:
    """One line: a bar of finished / enqueued, what is left, the rate and an ETA."""
    done = t["acked"] + t["dead"]
    total = max(t["enqueued"], done)
    left = t["backlog"] + t["pending"] + t["delayed"]
    frac = done / total if total else 1.0
    filled = min(width, int(frac * width))
    bar = "#" * filled + "-" * (width - filled)
    if left == 0:
        eta = "drained"
    elif rate > 0:
        eta = f"ETA {_duration(left / rate)}"
    else:
        eta = "ETA -"
    return (
        f"[{bar}] {frac * 100:5.1f}%  done {done}/{total}  left {left}"
        f" (backlog {t['backlog']}, pending {t['pending']}, delayed {t['delayed']})"
        f"  {_rate(rate)}  {eta}"
    )


@main.command()
@shared_options
@click.option("--interval", "-i", type=click.FloatRange(min=0.1), default=2.0, show_default=True, help="Seconds between refreshes.")
@click.option("--sort", "sort_key", type=click.Choice(("site", "backlog", "pending", "oldest", "delayed", "dead", "rate")), default="backlog", show_default=True)
@click.option("--limit", "-n", type=click.IntRange(min=0), default=20, show_default=True, help="Sites shown (0 = all).")
@click.option("--until-drained", is_flag=True, help="Exit 0 once nothing is left (no backlog, lease or delayed request).")
@click.option("--timeout", type=click.FloatRange(min=0), default=0, help="With --until-drained: give up after this many seconds (exit 4).")
@click.option("--progress-only", is_flag=True, help="Print only the progress line, one per refresh (for logs).")
def watch(redis_url: str, crawl: str, interval: float, sort_key: str, limit: int, until_drained: bool, timeout: float, progress_only: bool) -> None:
    """The status table, refreshed live, with a progress line for a draining crawl."""
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    tty = sys.stdout.isatty()
    progress = Progress()
    started = time.monotonic()
    try:
        while True:
            rows = read_rows(frontier)
            t = totals(rows)
            now = time.monotonic()
            progress.add(now, t["acked"] + t["dead"])
            rate = progress.rate()
            line = progress_line(t, t["rate_per_s"] if rate is None else rate)
            if progress_only:
                click.echo(line)
            else:
                frame = (
                    f"crawl {crawl} - {time.strftime('%H:%M:%S')} - every {interval:g}s\n\n"
                    f"{render_table(sort_rows(rows, sort_key, limit), STATUS_COLUMNS)}\n\n"
                    f"{summary_line(t)}\n{line}"
                )
                click.echo(("\x1b[H\x1b[2J" if tty else "\n") + frame)
            left = t["backlog"] + t["pending"] + t["delayed"]
            if until_drained and left == 0:
                click.echo(f"crawl {crawl} is drained")
                return
            if until_drained and timeout and now - started >= timeout:
                click.echo(f"error: crawl {crawl} not drained after {timeout:g}s ({left} left)", err=True)
                sys.exit(EXIT_TIMEOUT)
            time.sleep(interval)
    except KeyboardInterrupt:
        sys.exit(130)


# -- dead letters ----------------------------------------------------------------


def _sites(frontier: Frontier, site: str | None) -> list[str]:
    sites = frontier.sites()
    if site is None:
        return sites
    if site not in sites:
        raise CliError(f"site {site!r} is not registered in crawl {frontier.crawl!r}")
    return [site]


def _matches(letter: DeadLetter, text: str | None) -> bool:
    return not text or text in letter.reason or text in (letter.url or "")


@main.group()
def dlq() -> None:
    """Dead letters: list them, requeue them, or purge them."""


DLQ_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("site", "SITE", str),
    ("id", "ID", str),
    ("age", "AGE", str),
    ("deliveries", "DELIVERIES", str),
    ("queue", "QUEUE", str),
    ("reason", "REASON", str),
    ("url", "URL", str),
]


@dlq.command("list")
@shared_options
@click.option("--site", default=None, help="Only this site.")
@click.option("--match", default=None, help="Only letters whose reason or URL contains this text.")
@click.option("--limit", "-n", type=click.IntRange(min=0), default=50, show_default=True, help="Letters shown (0 = all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dlq_list(redis_url: str, crawl: str, site: str | None, match: str | None, limit: int, as_json: bool) -> None:
    """Dead letters, oldest first: site, id, age, deliveries, queue, reason, URL."""
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    now_ms = int(client.time()[0]) * 1000
    shown: list[DeadLetter] = []
    total = 0
    for s in _sites(frontier, site):
        for letter in iter_letters(frontier, s):
            if not _matches(letter, match):
                continue
            total += 1
            if limit == 0 or len(shown) < limit:
                shown.append(letter)
    if as_json:
        for letter in shown:
            click.echo(json.dumps(letter.as_dict(), sort_keys=True))
        return
    rows = [
        {**letter.as_dict(), "age": _age(now_ms - letter.ts_ms) if letter.ts_ms else "-",
         "reason": letter.reason[:60], "url": letter.url or "-"}
        for letter in shown
    ]
    if rows:
        click.echo(render_table(rows, DLQ_COLUMNS))
        click.echo("")
    click.echo(f"{len(shown)} of {total} dead letter(s) in crawl {crawl}" + (f" matching {match!r}" if match else ""))


@dlq.command("requeue")
@shared_options
@click.argument("ids", nargs=-1)
@click.option("--site", default=None, help="Only this site (required with IDS).")
@click.option("--all", "all_", is_flag=True, help="Requeue every dead letter (of --site, or of the crawl).")
@click.option("--match", default=None, help="With --all: only letters whose reason or URL contains this text.")
def dlq_requeue(redis_url: str, crawl: str, ids: tuple[str, ...], site: str | None, all_: bool, match: str | None) -> None:
    """Put dead letters back in the streams they came from, with a fresh delivery count.

    Give the IDS of one --site, or --all. Exit 1 if some IDS were not found.
    """
    if ids and all_:
        raise click.UsageError("give dead-letter IDS or --all, not both")
    if not ids and not all_:
        raise click.UsageError("give dead-letter IDS (with --site) or --all")
    if ids and site is None:
        raise click.UsageError("dead-letter IDS belong to one site: add --site")
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    requeued = kept = missing = 0
    for s in _sites(frontier, site):
        chosen = list(ids) if ids else [letter.id for letter in iter_letters(frontier, s) if _matches(letter, match)]
        if chosen:
            r, k, m = requeue_letters(frontier, s, chosen)
            requeued, kept, missing = requeued + r, kept + k, missing + m
    click.echo(
        f"requeued {requeued} dead letter(s) of crawl {crawl}"
        + (f"; kept {kept} that cannot be requeued (no payload, or not from a request stream)" if kept else "")
    )
    if missing and ids:
        raise CliError(f"{missing} of the {len(ids)} given id(s) are not in the dead letters of site {site}")


@dlq.command("purge")
@shared_options
@click.argument("ids", nargs=-1)
@click.option("--site", default=None, help="Only this site (required with IDS).")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def dlq_purge(redis_url: str, crawl: str, ids: tuple[str, ...], site: str | None, yes: bool) -> None:
    """Delete dead letters: the IDS of one --site, or every letter (of --site, or of the crawl)."""
    if ids and site is None:
        raise click.UsageError("dead-letter IDS belong to one site: add --site")
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    sites = _sites(frontier, site)
    what = f"{len(ids)} dead letter(s)" if ids else "every dead letter"
    where = f"site {site} of crawl {crawl}" if site else f"crawl {crawl}"
    if not yes:
        click.confirm(f"delete {what} of {where}?", abort=True)
    deleted = purge_letters(frontier, sites, ids)
    click.echo(f"deleted {deleted} dead letter(s) of {where}")


# -- pause / resume ------------------------------------------------------------------


def _set_paused(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool, paused: bool) -> None:
    for s in sites:
        try:
            validate_site_name(s)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SITE") from None
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    registered = set(frontier.sites())
    unknown = [s for s in sites if s not in registered]
    if unknown and not force:
        raise CliError(
            f"site(s) {', '.join(unknown)} not registered in crawl {crawl!r}; check the name,"
            " or add --force to set it before the site gets requests"
        )
    for s in sites:
        (pause_site if paused else resume_site)(frontier, s)
    verb = "paused" if paused else "resumed"
    note = (
        "workers stop leasing them at their next look; backlog, leases and delayed requests stay"
        if paused
        else "workers lease them again at their next look"
    )
    click.echo(f"{verb} {len(sites)} site(s) of crawl {crawl}: {', '.join(sites)} ({note})")


@main.command()
@shared_options
@click.argument("sites", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also for sites not registered yet.")
def pause(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool) -> None:
    """Stop leasing SITE(s); their backlog stays."""
    _set_paused(redis_url, crawl, sites, force, True)


@main.command()
@shared_options
@click.argument("sites", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also for sites not registered yet.")
def resume(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool) -> None:
    """Lease SITE(s) again."""
    _set_paused(redis_url, crawl, sites, force, False)


# -- nodes, crawls ----------------------------------------------------------------


NODE_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("node", "NODE", str),
    ("host", "HOST", str),
    ("pid", "PID", str),
    ("state", "STATE", str),
    ("silent", "LAST SEEN", str),
    ("held", "HELD", str),
    ("lease_s", "LEASE", str),
]


@main.command()
@shared_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nodes(redis_url: str, crawl: str, as_json: bool) -> None:
    """Worker nodes of a crawl: alive, dead (silent for 3 heartbeats) or offline."""
    client = _client(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    sec, usec = client.time()
    states = node_states(frontier.nodes(), int(sec) + int(usec) / 1e6)
    rows = [
        {
            "node": n.node,
            "host": str(n.info.get("host", "")),
            "pid": str(n.info.get("pid", "")),
            "state": n.state,
            "silent_s": round(n.silent_s, 1),
            "silent": _age(int(n.silent_s * 1000)) + " ago",
            "held": str(n.info.get("held", "")),
            "lease_s": f"{n.info['lease_s']:g}s" if isinstance(n.info.get("lease_s"), (int, float)) else "",
        }
        for n in states.values()
    ]
    if as_json:
        click.echo(json.dumps({"crawl": crawl, "nodes": rows}, indent=2))
        return
    if rows:
        click.echo(render_table(rows, NODE_COLUMNS) + "\n")
    counts = {s: sum(1 for r in rows if r["state"] == s) for s in ("alive", "dead", "offline")}
    click.echo(f"{len(rows)} node(s): {counts['alive']} alive, {counts['dead']} dead, {counts['offline']} offline")


@main.command()
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def crawls(redis_url: str, as_json: bool) -> None:
    """Every registered crawl with its totals."""
    client = _client(redis_url)
    out = []
    for name in Frontier.crawls(client):
        t = totals(read_rows(Frontier(client, name)))
        out.append({"crawl": name, **t})
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    columns: list[tuple[str, str, Callable[[Any], str]]] = [
        ("crawl", "CRAWL", str), ("sites", "SITES", str), ("backlog", "BACKLOG", str),
        ("pending", "PENDING", str), ("delayed", "DELAYED", str), ("dead", "DEAD", str),
        ("acked", "ACKED", str), ("enqueued", "ENQUEUED", str), ("rate_per_s", "RATE 1M", _rate),
    ]
    click.echo(render_table(out, columns) if out else "no crawls")


@main.command("migrate-scrapy-redis")
@redis_option
@click.option("--spider", required=True, help="The scrapy-redis spider name (its keys are <spider>:requests, ...).")
@click.option("--crawl", "-c", envvar="STREAMS_PREFIX", default=None, help="streams-sched crawl to fill (default: the spider name).")
@click.option("--from-redis-url", default=None, help="Redis of the scrapy-redis crawl (default: --redis-url).")
@click.option("--start-urls-key", default="%(name)s:start_urls", show_default=True, help="REDIS_START_URLS_KEY.")
@click.option("--queue-key", default="%(spider)s:requests", show_default=True, help="SCHEDULER_QUEUE_KEY.")
@click.option("--dupefilter-key", default="%(spider)s:dupefilter", show_default=True, help="SCHEDULER_DUPEFILTER_KEY.")
@click.option("--queue-class", type=click.Choice(["auto", "PriorityQueue", "FifoQueue", "LifoQueue"]), default="auto", show_default=True,
              help="SCHEDULER_QUEUE_CLASS (auto: a zset is PriorityQueue, a list FifoQueue); only the order differs.")
@click.option("--trust-pickle", is_flag=True, help="Unpickle the pending request queue (runs code: only for a Redis only your workers wrote to).")
@click.option("--skip-queue", is_flag=True, help="Leave the pending request queue out.")
@click.option("--dry-run", is_flag=True, help="Only print what would be migrated.")
def migrate_scrapy_redis(redis_url: str, spider: str, crawl: str | None, from_redis_url: str | None, start_urls_key: str,
                         queue_key: str, dupefilter_key: str, queue_class: str, trust_pickle: bool, skip_queue: bool,
                         dry_run: bool) -> None:
    """Copy a scrapy-redis crawl (start URLs, dupefilter, pending requests) into a streams-sched crawl.

    The scrapy-redis keys are only read. Running it again adds nothing new. Stop the
    scrapy-redis workers first (their queue is read as it is at this moment)."""
    from .keys import validate_crawl_name
    from .migrate import ScrapyRedisCrawl
    from .seeding import Seeder

    crawl = crawl or spider
    try:
        validate_crawl_name(crawl, "--crawl")
        keys = {"start": start_urls_key % {"name": spider}, "queue": queue_key % {"spider": spider}, "dupefilter": dupefilter_key % {"spider": spider}}
    except (KeyError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    source = _client(from_redis_url or redis_url)
    target = _client(redis_url) if from_redis_url else source
    job = ScrapyRedisCrawl(source, None, start_urls_key=keys["start"], queue_key=keys["queue"],
                           dupefilter_key=keys["dupefilter"], lifo=queue_class == "LifoQueue")
    counts = job.count()
    click.echo(
        f"scrapy-redis crawl {spider}: {counts.start_urls.found} start URL(s) in {keys['start']} ({counts.start_urls_kind}),"
        f" {counts.queue.found} pending request(s) in {keys['queue']} ({counts.queue_kind}),"
        f" {counts.dupefilter.found} fingerprint(s) in {keys['dupefilter']}"
    )
    if queue_class == "PriorityQueue" and counts.queue_kind == "list" or queue_class in ("FifoQueue", "LifoQueue") and counts.queue_kind == "zset":
        raise CliError(f"{keys['queue']} is a {counts.queue_kind}, which does not hold a {queue_class}")
    if dry_run:
        if counts.queue.found and not skip_queue and not trust_pickle:
            click.echo("the pending requests need --trust-pickle (or --skip-queue)")
        click.echo(f"dry run: nothing written to crawl {crawl}")
        return
    if counts.queue.found and not skip_queue and not trust_pickle:
        from .migrate import PickleRefused

        try:
            job.copy_queue(counts.queue_kind, trust_pickle=False)
        except PickleRefused as exc:
            raise CliError(str(exc), 2) from None
    job.seeder = seeder = Seeder(target, crawl)
    total = counts.dupefilter.found + counts.start_urls.found + (0 if skip_queue else counts.queue.found)
    with click.progressbar(length=total, label="migrating", file=sys.stderr, show_pos=True) as bar:
        # the pending queue first, unchecked: scrapy-redis put these in its SET when it queued them
        queue = counts.queue if skip_queue else job.copy_queue(counts.queue_kind, trust_pickle, bar.update)
        dupefilter = job.copy_dupefilter(bar.update)
        start = job.copy_start_urls(counts.start_urls_kind, bar.update)
    click.echo(f"migrated into crawl {crawl}:")
    click.echo(f"  pending requests: {queue.read} read, {queue.added} added, {queue.duplicates} already there,"
               f" {queue.dead} dead-lettered (site _migrate)" + (" [skipped]" if skip_queue else ""))
    click.echo(f"  dupefilter: {dupefilter.read} fingerprint(s), {dupefilter.added} new in {seeder.frontier.keys.legacy_seen}")
    click.echo(f"  start URLs: {start.read} read, {start.added} added, {start.duplicates} duplicate(s), {start.dead} dead-lettered (site _migrate)")
