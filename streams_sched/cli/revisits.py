"""``streams-sched revisits``: list the tracked pages of a crawl, or stop their tracking."""

from __future__ import annotations

import json

import click

from streams_sched.admin.revisits import resume_tracking, stop_tracking, tracked_pages
from streams_sched.cli.formatting import Column, render_table
from streams_sched.cli.options import CliError, connect, known_crawl, shared_options

__all__ = ["revisits"]


@click.command("revisits")
@shared_options
@click.argument("site", required=False)
@click.argument("url", required=False)
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Most pages listed.")
@click.option("--stop", is_flag=True, help="Stop tracking the URL, the site, or (neither given) every page of the crawl.")
@click.option("--resume", is_flag=True, help="Undo a --stop of the site, or (no site given) of the crawl.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def revisits(redis_url: str, crawl: str, site: str | None, url: str | None, limit: int, stop: bool, resume: bool,
             as_json: bool) -> None:
    """List tracked pages waiting for their next visit (soonest first per site), or --stop
    their tracking: a crawl whose tracking is stopped drains as any other."""
    frontier = known_crawl(connect(redis_url), crawl, redis_url)
    if site is not None and not frontier.client.sismember(frontier.site(site).index.sites, site):
        raise CliError(f"site {site!r} is not registered in crawl {crawl!r}")
    if stop and resume:
        raise click.UsageError("give --stop or --resume, not both")
    if resume:
        if url is not None:
            raise click.UsageError("--resume takes a site or nothing: a stopped URL is tracked again when it is enqueued again")
        back = resume_tracking(frontier, site)
        click.echo(f"tracking resumed for {f'site {site}' if site else f'crawl {crawl}'} ({back} site(s) turned back on)")
        return
    if stop:
        removed = stop_tracking(frontier, site, url)
        what = url or (f"site {site}" if site else f"crawl {crawl}")
        click.echo(f"stopped tracking {what}: {removed} waiting visit(s) removed")
        if url is not None and removed == 0:
            click.echo("none was waiting: a visit of it in flight or queued now will not be scheduled again")
        return
    pages = tracked_pages(frontier, site, url, limit)
    now_ms = frontier.clock.now() * 1000
    rows = [{"site": p.site, "url": p.url, "due_in_s": round((p.due_ms - now_ms) / 1000, 1),
             "interval_s": round(p.interval_s, 1)} for p in pages]
    if as_json:
        click.echo(json.dumps(rows))
        return
    if not rows:
        click.echo("no tracked page is waiting")
        return
    columns = [Column("url", "url", str), Column("site", "site", str), Column("due_in_s", "due in s", str),
               Column("interval_s", "interval s", str)]
    click.echo(render_table(rows, columns))
    if len(rows) == limit:
        click.echo(f"(first {limit}; --limit for more)")
