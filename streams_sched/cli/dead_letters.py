"""``streams-sched dlq``: list, requeue or purge the dead letters of a crawl."""

from __future__ import annotations

import json

import click

from streams_sched.admin.dlq import DeadLetter, iter_letters, purge_letters, requeue_letters
from streams_sched.cli.formatting import Column, format_age, render_table
from streams_sched.cli.options import (
    CliError,
    allow_eviction_option,
    connect,
    connect_for_writes,
    known_crawl,
    shared_options,
)
from streams_sched.frontier.client import Frontier

__all__ = ["dlq"]


def _sites(frontier: Frontier, site: str | None, chunk: int = 1000) -> list[str]:
    """``site`` if it is registered, else every registered site that has dead letters (the
    registry is read whole, then one XLEN per site, ``chunk`` per round trip)."""
    if site is not None:
        if not frontier.client.sismember(frontier.site(site).index.sites, site):
            raise CliError(f"site {site!r} is not registered in crawl {frontier.crawl!r}")
        return [site]
    sites = frontier.sites()
    out = []
    for i in range(0, len(sites), chunk):
        part = sites[i : i + chunk]
        pipe = frontier.client.pipeline(transaction=False)
        for s in part:
            pipe.xlen(frontier.site(s).dlq)
        out += [s for s, n in zip(part, pipe.execute(), strict=True) if int(n)]
    return out


def _matches(letter: DeadLetter, text: str | None) -> bool:
    return not text or text in letter.reason or text in (letter.url or "")


@click.group()
def dlq() -> None:
    """Dead letters: list them, requeue them, or purge them."""


DLQ_COLUMNS: list[Column] = [
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
    client = connect(redis_url)
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
        {**letter.as_dict(), "age": format_age(now_ms - letter.ts_ms) if letter.ts_ms else "-",
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
@allow_eviction_option
def dlq_requeue(redis_url: str, crawl: str, ids: tuple[str, ...], site: str | None, all_: bool, match: str | None,
                allow_eviction: bool) -> None:
    """Put dead letters back in the streams they came from, with a fresh delivery count.

    Give the IDS of one --site, or --all. Exit 1 if some IDS were not found.
    """
    if ids and all_:
        raise click.UsageError("give dead-letter IDS or --all, not both")
    if not ids and not all_:
        raise click.UsageError("give dead-letter IDS (with --site) or --all")
    if ids and site is None:
        raise click.UsageError("dead-letter IDS belong to one site: add --site")
    client = connect_for_writes(redis_url, allow_eviction)
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
    client = connect(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    sites = _sites(frontier, site)
    what = f"{len(ids)} dead letter(s)" if ids else "every dead letter"
    where = f"site {site} of crawl {crawl}" if site else f"crawl {crawl}"
    if not yes:
        click.confirm(f"delete {what} of {where}?", abort=True)
    deleted = purge_letters(frontier, sites, ids)
    click.echo(f"deleted {deleted} dead letter(s) of {where}")
