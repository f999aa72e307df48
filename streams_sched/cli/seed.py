"""``streams-sched push``: add seed URLs to a crawl."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import click

from streams_sched.cli.options import (
    CliError,
    allow_eviction_option,
    connect_for_writes,
    load_fingerprinter,
    shared_options,
)
from streams_sched.frontier.keys import validate_site_name
from streams_sched.wire.callbacks import check_name

__all__ = ["push"]


@click.command()
@shared_options
@click.argument("urls", nargs=-1)
@click.option("--file", "-f", "files", multiple=True, type=click.File("r"), help="Read URLs from a file, one per line ('-' = stdin).")
@click.option("--priority", "-p", default=0, show_default=True, help="Request.priority of the seeds (decides the band).")
@click.option("--site", default=None, help="Put every URL in this site instead of its host.")
@click.option("--callback", default=None, help="Spider method to call (default: parse).")
@click.option("--dont-filter", is_flag=True, help="Skip dedupe.")
@click.option("--fingerprinter", default=None, metavar="IMPORT.PATH",
              help="The project's REQUEST_FINGERPRINTER_CLASS, if it changes Scrapy's (seeds must dedupe as the workers do); built through its from_crawler with the settings of the project push runs in.")
@click.option("--batch", default=500, show_default=True, type=click.IntRange(min=1),
              help="URLs per round of enqueue calls (one call per shard; the next round is sent while one is read).")
@allow_eviction_option
def push(redis_url: str, crawl: str, urls: tuple[str, ...], files: tuple[Any, ...], priority: int, site: str | None, callback: str | None, dont_filter: bool, fingerprinter: str | None, batch: int, allow_eviction: bool) -> None:
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
    if callback is not None:
        try:
            check_name(callback)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--callback") from None
    fingerprint = load_fingerprinter(fingerprinter) if fingerprinter else None
    client = connect_for_writes(redis_url, allow_eviction)
    from streams_sched.frontier.seeding import (
        Seeder,  # imports Scrapy (its request fingerprinter): only when seeding
    )

    added = dups = 0
    try:
        seeder = Seeder(client, crawl, check_server=False, batch=batch, fingerprinter=fingerprint)
        lines = (line for source in sources for line in source)
        # one seeding run over every line, counted batch by batch: the Seeder keeps a batch
        # in flight while it prepares the next, and nobody needs the list of URLs
        for part in seeder.seed_batches(lines, priority=priority, site=site, callback=callback, dont_filter=dont_filter):
            added, dups = added + len(part.added), dups + len(part.duplicates)
    except ValueError as exc:
        raise CliError(f"{exc} (pushed {added} request(s) before it)") from None
    click.echo(f"pushed {added} request(s) to crawl {crawl} ({dups} duplicate(s) skipped)")
