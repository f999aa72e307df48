"""Per-site policy from the command line: ``site set``, ``site show``, ``pause`` and ``resume``."""

from __future__ import annotations

import json

import click

from streams_sched.cli.formatting import Column, render_table
from streams_sched.cli.options import CliError, connect, known_crawl, shared_options
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import validate_site_name
from streams_sched.frontier.replies import text
from streams_sched.politeness.policy import POLICY_FIELDS, get_policy, pause_site, resume_site, set_policy

__all__ = ["pause", "resume", "site"]


@click.group()
def site() -> None:
    """Per-site policy: rate limit, weight, task type, browser cap, page cap, pause, revisits."""


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
@click.option("--revisit", help="Track the site's pages: 1h, or 1h:adaptive,min=5m,max=7d (units s, m, h, d).")
def site_set(redis_url: str, crawl: str, name: str, rate: float | None, burst: float | None, weight: float | None,
             task_type: str | None, max_browser: int | None, paused: bool | None, max_pages: int | None,
             revisit: str | None) -> None:
    """Change a site's policy (NAME "*" = the default for sites without their own).

    Workers pick it up within STREAMS_POLICY_REFRESH_SECONDS (the site's own policy on
    their next lease of it, at once)."""
    fields = {k: v for k, v in {"rate": rate, "burst": burst, "weight": weight, "task_type": task_type,
                                "max_browser": max_browser, "paused": paused, "max_pages": max_pages,
                                "revisit": revisit}.items()
              if v is not None}
    if not fields:
        raise click.UsageError(
            "give at least one of --rate --burst --weight --task-type --max-browser --max-pages --revisit "
            "--paused/--resumed"
        )
    frontier = Frontier(connect(redis_url), crawl)
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
    frontier = Frontier(connect(redis_url), crawl)
    policies = {name: get_policy(frontier, name)} if name else {"*": get_policy(frontier, "*"), **_policies(frontier)}
    if as_json:
        click.echo(json.dumps(policies, indent=2, sort_keys=True))
        return
    columns: list[Column] = [("site", "SITE", str), *((f, f.upper(), str) for f in POLICY_FIELDS)]
    rows = [{"site": n, **{f: p.get(f, "-") for f in POLICY_FIELDS}} for n, p in policies.items() if p or n == "*" or name]
    click.echo(render_table(rows, columns))


def _policies(frontier: Frontier, chunk: int = 1000) -> dict[str, dict[str, str]]:
    """The policy of every registered site, ``chunk`` sites per round trip."""
    sites = frontier.sites()
    out: dict[str, dict[str, str]] = {}
    for i in range(0, len(sites), chunk):
        part = sites[i : i + chunk]
        pipe = frontier.client.pipeline(transaction=False)
        for s in part:
            pipe.hgetall(frontier.site(s).policy)
        for s, raw in zip(part, pipe.execute(), strict=True):
            out[s] = {text(k): text(v) for k, v in raw.items() if text(k) in POLICY_FIELDS}
    return out


def _registered(frontier: Frontier, sites: tuple[str, ...]) -> list[bool]:
    """Whether each site is in its shard's registry (one SISMEMBER each, not a listing)."""
    pipe = frontier.client.pipeline(transaction=False)
    for s in sites:
        pipe.sismember(frontier.site(s).index.sites, s)
    return [bool(v) for v in pipe.execute()]


def _set_paused(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool, paused: bool) -> None:
    for s in sites:
        try:
            validate_site_name(s)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SITE") from None
    client = connect(redis_url)
    frontier = known_crawl(client, crawl, redis_url)
    unknown = [s for s, known in zip(sites, _registered(frontier, sites), strict=True) if not known]
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


@click.command()
@shared_options
@click.argument("sites", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also for sites not registered yet.")
def pause(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool) -> None:
    """Stop leasing SITE(s); their backlog stays."""
    _set_paused(redis_url, crawl, sites, force, True)


@click.command()
@shared_options
@click.argument("sites", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Also for sites not registered yet.")
def resume(redis_url: str, crawl: str, sites: tuple[str, ...], force: bool) -> None:
    """Lease SITE(s) again."""
    _set_paused(redis_url, crawl, sites, force, False)
