"""``streams-sched nodes`` (the workers of a crawl) and ``crawls`` (every crawl with its totals)."""

from __future__ import annotations

import json

import click

from streams_sched.cli.formatting import Column, format_age, format_rate, render_table
from streams_sched.cli.options import connect, known_crawl, redis_option, shared_options
from streams_sched.cli.report import DEFAULT_TOP, read_report, totals
from streams_sched.frontier.client import Frontier
from streams_sched.service.liveness import node_states

__all__ = ["crawls", "nodes"]


NODE_COLUMNS: list[Column] = [
    ("node", "NODE", str),
    ("host", "HOST", str),
    ("pid", "PID", str),
    ("state", "STATE", str),
    ("silent", "LAST SEEN", str),
    ("held", "HELD", str),
    ("local", "LOCAL", str),
    ("browser", "BROWSER", str),
    ("lease_s", "LEASE", str),
]


@click.command()
@shared_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def nodes(redis_url: str, crawl: str, as_json: bool) -> None:
    """Worker nodes of a crawl: alive, dead (silent for 3 heartbeats) or offline."""
    client = connect(redis_url)
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
            "silent": format_age(int(n.silent_s * 1000)) + " ago",
            "held": str(n.info.get("held", "")),
            "local": str(n.info.get("local", "")),
            # browser leases held against the cap, for a worker with the browser capability
            "browser": f"{n.info.get('browser', 0)}/{n.info['browser_max']}" if n.info.get("browser_max") else "",
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


@click.command()
@redis_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--top", type=click.IntRange(min=1), default=DEFAULT_TOP, show_default=True,
              help="Sites with work read per crawl (the totals of backlog, pending and delayed are over them).")
@click.option("--all", "all_sites", is_flag=True, help="Read every site of every crawl (acked and dead letters of all sites).")
def crawls(redis_url: str, as_json: bool, top: int, all_sites: bool) -> None:
    """Every registered crawl with its totals."""
    client = connect(redis_url)
    out = []
    for name in Frontier.crawls(client):
        report = read_report(Frontier(client, name), top, all_sites)
        # "layout" stays in the JSON as 0.1.0 wrote it, for scripts that read it
        out.append({"crawl": name, "layout": "sharded", **totals(report.rows, report)})
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    columns: list[Column] = [
        ("crawl", "CRAWL", str), ("sites", "SITES", str), ("backlog", "BACKLOG", str),
        ("pending", "PENDING", str), ("delayed", "DELAYED", str), ("dead", "DEAD", str),
        ("done", "FINISHED", str), ("enqueued", "ENQUEUED", str), ("rate_per_s", "RATE 1M", format_rate),
    ]
    click.echo(render_table(out, columns) if out else "no crawls")
