"""``streams-sched purge``: delete a crawl, or one site of it, from Redis."""

from __future__ import annotations

import click

from streams_sched.cli.options import connect, shared_options
from streams_sched.connect.clients import redact
from streams_sched.frontier.client import Frontier

__all__ = ["purge"]


@click.command()
@shared_options
@click.option("--site", default=None, help="Purge only this site.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def purge(redis_url: str, crawl: str, site: str | None, yes: bool) -> None:
    """Delete a crawl (or one site of it) from Redis: backlog, leases, seen filter, dead letters."""
    client = connect(redis_url)
    frontier = Frontier(client, crawl)
    what = f"site {site} of crawl {crawl}" if site else f"crawl {crawl}"
    if not yes:
        click.confirm(f"delete {what} from {redact(redis_url)}?", abort=True)
    if site:
        deleted = int(frontier.purge_site(site))  # its keys, and its place in the shard's indexes and registry
    else:
        deleted = frontier.purge()
    click.echo(f"purged {what} ({deleted} key(s) deleted)")
