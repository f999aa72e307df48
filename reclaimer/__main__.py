"""``streams-reclaimer`` / ``python -m reclaimer``: the reclaimer daemon's command line.

Exit codes: 0 stopped cleanly (SIGTERM, SIGINT, or --burst done), 1 a pass
failed in --burst mode or --check found no recent pass, 2 bad options,
3 Redis unreachable at start (one line on stderr), 6 every crawl it looks after
has moved to another Redis (streams-sched move; one line naming where).
"""

from __future__ import annotations

import json
import socket
import sys
from typing import Any

import click
from redis.exceptions import ResponseError

from streams_sched.errors import ConfigError, RedisUnavailable
from streams_sched.frontier.keys import health_key
from streams_sched.service.daemon import (
    EXIT_ERROR,
    EXIT_UNREACHABLE,
    configure_logging,
    connect_at_start,
    fail,
    refused_line,
    serve,
)

from .core import Reclaimer
from .settings import ReclaimerSettings

PROG = "streams-reclaimer"



@click.command(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "STREAMS_RECLAIMER"})
@click.option("--redis-url", envvar="REDIS_URL", default="redis://localhost:6379/0", show_default=True, help="The frontier's Redis (env REDIS_URL).")
@click.option("--interval", type=float, default=5.0, show_default=True, help="Seconds between passes.")
@click.option("--prefix", "crawls", multiple=True, help="Crawl to look after (repeatable; default: every registered crawl).")
@click.option("--metrics-port", type=int, default=None, help="Serve the reclaimer's own Prometheus metrics on this port.")
@click.option("--metrics-addr", default="0.0.0.0", show_default=True, help="Address of the metrics server.")
@click.option("--lease-seconds", type=float, default=None, help="Requeue leases idle this long (default: the longest lease the crawl's workers advertise, else 300).")
@click.option("--max-deliveries", type=int, default=None, help="Dead-letter entries delivered more often (default: from the workers, else 5).")
@click.option("--batch", type=int, default=500, show_default=True, help="Entries per XAUTOCLAIM / promote call for one site.")
@click.option("--prune-interval", type=float, default=60.0, show_default=True, help="Seconds between looks for gone consumers.")
@click.option("--node-retention", type=float, default=3600.0, show_default=True, help="Seconds a dead or offline node's record is kept (0 = forever).")
@click.option("--consumer", default="streams-reclaimer", show_default=True, help="Consumer name the requeues run under.")
@click.option("--name", default=None, help="Name in the health key ss:health:reclaimer:NAME (default: the host name).")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for Redis at start.")
@click.option("--allow-eviction", is_flag=True, envvar="STREAMS_ALLOW_EVICTION", help="Start even on a Redis whose maxmemory-policy is allkeys-* (it evicts queued requests silently; env STREAMS_ALLOW_EVICTION).")
@click.option("--burst", is_flag=True, help="Run one pass and exit.")
@click.option("--check", is_flag=True, help="Exit 0 if this host's reclaimer (--name) passed recently, else 1.")
@click.option("--log-format", type=click.Choice(["json", "console"]), default="json", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG.")
def main(
    redis_url: str,
    interval: float,
    crawls: tuple[str, ...],
    metrics_port: int | None,
    metrics_addr: str,
    lease_seconds: float | None,
    max_deliveries: int | None,
    batch: int,
    prune_interval: float,
    node_retention: float,
    consumer: str,
    name: str | None,
    connect_timeout: float,
    allow_eviction: bool,
    burst: bool,
    check: bool,
    log_format: str,
    verbose: bool,
) -> None:
    """Requeue expired leases, dead-letter poison entries, move due delayed
    requests and remove gone consumers, for every crawl, every --interval seconds."""
    configure_logging(log_format, "DEBUG" if verbose else "INFO")
    try:
        settings = ReclaimerSettings(
            redis_url=redis_url,
            interval_s=interval,
            crawls=crawls,
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            lease_s=lease_seconds,
            max_deliveries=max_deliveries,
            batch=batch,
            prune_interval_s=prune_interval,
            node_retention_s=node_retention,
            consumer=consumer,
            name=name or socket.gethostname(),
            connect_timeout_s=connect_timeout,
            allow_eviction=allow_eviction,
            burst=burst,
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if check:
        sys.exit(_check(settings))
    serve(PROG, Reclaimer(settings))


def _check(settings: ReclaimerSettings) -> int:
    try:
        client = connect_at_start(settings.redis_url, settings.connect_timeout_s)
    except RedisUnavailable as exc:
        fail(PROG, str(exc), EXIT_UNREACHABLE)
    try:
        raw: Any = client.get(health_key("reclaimer", settings.name))
    except ResponseError as exc:  # while a snapshot fails Redis refuses even this (MISCONF)
        fail(PROG, refused_line(exc, "reclaimer"), EXIT_ERROR)
    if raw is None:
        click.echo(f"{PROG}: no recent pass of reclaimer {settings.name!r}", err=True)
        return EXIT_ERROR
    click.echo(json.dumps(json.loads(raw), sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
