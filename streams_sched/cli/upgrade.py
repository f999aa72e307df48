"""``streams-sched upgrade``: move a crawl written before shards to the sharded key layout."""

from __future__ import annotations

import json
import time

import click

from streams_sched.admin.upgrade import Upgrade
from streams_sched.admin.upgrade_plan import Counts, UpgradeResult
from streams_sched.cli.options import CliError, allow_eviction_option, connect_for_writes, shared_options
from streams_sched.frontier.keys import DEFAULT_SHARDS, MAX_SHARDS

__all__ = ["upgrade"]


def _counts(c: Counts) -> str:
    return f"queued {c.queued}, pending {c.pending}, delayed {c.delayed}, dead letters {c.dead_letters}"


@click.command()
@shared_options
@click.option("--shards", type=click.IntRange(1, MAX_SHARDS), default=DEFAULT_SHARDS, show_default=True,
              help="Shards to spread the sites over (kept if an earlier run already chose them).")
@click.option("--force", is_flag=True, help="Run even while nodes of the crawl are online.")
@click.option("--batch", type=click.IntRange(min=1), default=100, show_default=True,
              help="Sites moved per round trip (their keys are held in memory at once).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@allow_eviction_option
def upgrade(redis_url: str, crawl: str, shards: int, force: bool, batch: int, as_json: bool, allow_eviction: bool) -> None:
    """Move a crawl written by a version before shards to the sharded key layout.

    Stop every worker, reclaimer and Seeder of the crawl first. Queued, leased, delayed
    and dead-lettered requests, seen filters, stats and policies move with their TTLs;
    leased entries stay leased and are taken over once their lease expires. Safe to run
    again after a crash: the crawl is refused by workers until a run finishes."""
    client = connect_for_writes(redis_url, allow_eviction)
    last = [0.0]

    def progress(result: UpgradeResult, done: int, total: int) -> None:
        now = time.monotonic()
        if not as_json and (now - last[0] >= 1.0 or done == total):
            last[0] = now
            click.echo(f"{done}/{total} site(s): {result.moved} moved, {result.skipped} skipped,"
                       f" {result.keys_moved} key(s) moved, {len(result.failed)} failed")

    result = Upgrade(client, crawl, shards, batch).run(force=force, progress=progress)
    if as_json:
        click.echo(json.dumps({
            "crawl": crawl, "shards": result.shards, "already": result.already, "finished": result.finished,
            "sites": result.sites, "moved": result.moved, "skipped": result.skipped,
            "keys_moved": result.keys_moved, "keys_dropped": result.keys_dropped,
            "before": result.before.__dict__, "after": result.after.__dict__,
            "mismatched": result.mismatched, "failed": result.failed, "duration_s": round(result.duration_s, 3),
        }, indent=2))
    elif result.already:
        click.echo(f"crawl {crawl} already has the sharded layout ({result.shards} shards): nothing to do")
        return
    else:
        click.echo(
            f"crawl {crawl}: {result.moved} site(s) moved to {result.shards} shards ({result.keys_moved} key(s)),"
            f" {result.skipped} skipped (no old keys: moved by an earlier run, or empty)"
            + (f", {result.keys_dropped} out-of-date key(s) of an earlier run dropped" if result.keys_dropped else "")
            + f" in {result.duration_s:.1f}s"
        )
        click.echo(f"  before: {_counts(result.before)}")
        click.echo(f"  after:  {_counts(result.after)}")
        for site in result.mismatched[:20]:
            click.echo(f"warning: site {site} holds other counts after the move: something wrote to it meanwhile", err=True)
    if result.failed:
        shown = "; ".join(f"{s}: {why}" for s, why in list(result.failed.items())[:5])
        raise CliError(
            f"{len(result.failed)} site(s) could not be moved ({shown}); the crawl keeps its old registry,"
            " so workers still refuse it: fix the cause and run the upgrade again"
        )
    if not as_json:
        click.echo(f"crawl {crawl} is upgraded: workers of this version can run on it")
