"""``streams-sched migrate-scrapy-redis``: copy a scrapy-redis crawl into a streams-sched crawl.

The only module of the package that imports :mod:`streams_sched.scrapy_redis.migrate` (pickle,
behind ``--trust-pickle``); it does so, and imports Scrapy, only when the command runs.
"""

from __future__ import annotations

import sys

import click

from streams_sched.cli.options import (
    CliError,
    allow_eviction_option,
    connect,
    connect_for_writes,
    redis_option,
)
from streams_sched.exit_codes import EXIT_USAGE
from streams_sched.frontier.keys import validate_crawl_name

__all__ = ["migrate_scrapy_redis"]


@click.command("migrate-scrapy-redis")
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
@allow_eviction_option
def migrate_scrapy_redis(redis_url: str, spider: str, crawl: str | None, from_redis_url: str | None, start_urls_key: str,
                         queue_key: str, dupefilter_key: str, queue_class: str, trust_pickle: bool, skip_queue: bool,
                         dry_run: bool, allow_eviction: bool) -> None:
    """Copy a scrapy-redis crawl (start URLs, dupefilter, pending requests) into a streams-sched crawl.

    The scrapy-redis keys are only read. Running it again adds nothing new. Stop the
    scrapy-redis workers first (their queue is read as it is at this moment)."""
    from streams_sched.frontier.seeding import Seeder
    from streams_sched.scrapy_redis.migrate import (
        ScrapyRedisCrawl,  # imports Scrapy and pickle: only when migrating
    )

    crawl = crawl or spider
    try:
        validate_crawl_name(crawl, "--crawl")
        keys = {"start": start_urls_key % {"name": spider}, "queue": queue_key % {"spider": spider}, "dupefilter": dupefilter_key % {"spider": spider}}
    except (KeyError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None
    # the target gets the requests: a dry run writes nothing, else it must not evict them
    target = connect(redis_url) if dry_run else connect_for_writes(redis_url, allow_eviction)
    source = connect(from_redis_url) if from_redis_url else target
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
        from streams_sched.scrapy_redis.migrate import PickleRefused

        try:
            job.copy_queue(counts.queue_kind, trust_pickle=False)
        except PickleRefused as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    job.seeder = seeder = Seeder(target, crawl, check_server=False)
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
