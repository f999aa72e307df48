"""``streams-monitor`` / ``python -m monitor``: the monitor daemon's command line.

Exit codes: 0 stopped cleanly (SIGTERM, SIGINT, or --burst done), 1 the read
failed in --burst mode or the metrics port is taken, 2 bad options, 3 Redis
unreachable at start (one line on stderr), 6 every crawl it watches has moved to
another Redis (streams-sched move; one line naming where).
"""

from __future__ import annotations

import click

from streams_sched.errors import ConfigError
from streams_sched.service.daemon import configure_logging, serve

from .core import Monitor
from .settings import WEBHOOK_FORMATS, MonitorSettings

PROG = "streams-monitor"



@click.command(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "STREAMS_MONITOR"})
@click.option("--redis-url", envvar="REDIS_URL", default="redis://localhost:6379/0", show_default=True, help="The frontier's Redis (env REDIS_URL); a read-only ACL user is enough.")
@click.option("--metrics-port", type=int, default=9108, show_default=True, help="Serve /metrics on this port.")
@click.option("--metrics-addr", default="0.0.0.0", show_default=True, help="Address of the metrics server.")
@click.option("--prefix", "crawls", multiple=True, help="Crawl to watch (repeatable; default: every registered crawl).")
@click.option("--webhook-url", default=None, help="POST alerts (JSON) to this URL, e.g. a DingTalk or WeCom robot.")
@click.option("--webhook-format", type=click.Choice(WEBHOOK_FORMATS), default="text", show_default=True, help="text: DingTalk/WeCom robot message; json: the alert object.")
@click.option("--webhook-secret", envvar="STREAMS_WEBHOOK_SECRET", default=None, help="DingTalk signing secret (env STREAMS_WEBHOOK_SECRET).")
@click.option("--backlog-threshold", type=int, default=0, show_default=True, help="Alert when a site's backlog passes this (0 = off).")
@click.option("--interval", type=float, default=10.0, show_default=True, help="Seconds between alert evaluations.")
@click.option("--cache-seconds", type=float, default=2.0, show_default=True, help="Scrapes within this long of the last read reuse it.")
@click.option("--max-sites", type=int, default=100, show_default=True, help="Sites per crawl with their own site label; the rest are summed as site=\"_other\".")
@click.option("--index-sites", type=int, default=500, show_default=True, help="Sites read per shard from each of its indexes (leased, ready): every site with work while there are fewer.")
@click.option("--sweep-sites", type=int, default=2000, show_default=True, help="Registered sites also read per pass, in turn, so crawl-wide sums catch up with idle sites.")
@click.option("--dlq-quiet-seconds", type=float, default=600.0, show_default=True, help="A dead-letters-growing alert clears after this long without growth.")
@click.option("--send-resolved/--no-send-resolved", default=True, show_default=True, help="Also POST when an alert clears.")
@click.option("--events/--no-events", default=True, show_default=True, help="Listen to node events (pub/sub) besides the nodes hash.")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True, help="Seconds to wait for Redis at start.")
@click.option("--allow-eviction", is_flag=True, envvar="STREAMS_ALLOW_EVICTION", help="Start even on a Redis whose maxmemory-policy is allkeys-* (it evicts queued requests silently; env STREAMS_ALLOW_EVICTION).")
@click.option("--state-file", default=None, help="Keep the alert state in this file, so a restart neither repeats nor loses an alert.")
@click.option("--worker-rate", type=float, default=0.0, show_default=True, help="Requests/s one worker does, for streams_sched_workers_wanted (0: measured from the workers' heartbeats).")
@click.option("--scale-horizon-seconds", type=float, default=60.0, show_default=True, help="An unlimited site's backlog asks for the rate that crawls it in this long.")
@click.option("--max-workers", type=int, default=0, show_default=True, help="Cap of streams_sched_workers_wanted (0: none).")
@click.option("--burst", is_flag=True, help="Read once, send due alerts, print the metrics on stdout and exit.")
@click.option("--log-format", type=click.Choice(["json", "console"]), default="json", show_default=True)
@click.option("-v", "--verbose", is_flag=True, help="Log at DEBUG.")
def main(
    redis_url: str,
    metrics_port: int,
    metrics_addr: str,
    crawls: tuple[str, ...],
    webhook_url: str | None,
    webhook_format: str,
    webhook_secret: str | None,
    backlog_threshold: int,
    interval: float,
    cache_seconds: float,
    max_sites: int,
    index_sites: int,
    sweep_sites: int,
    dlq_quiet_seconds: float,
    send_resolved: bool,
    events: bool,
    connect_timeout: float,
    allow_eviction: bool,
    state_file: str | None,
    worker_rate: float,
    scale_horizon_seconds: float,
    max_workers: int,
    burst: bool,
    log_format: str,
    verbose: bool,
) -> None:
    """Export every crawl's frontier to Prometheus, watch the worker nodes, and
    POST alerts (backlog over threshold, node dead, dead letters growing)."""
    configure_logging(log_format, "DEBUG" if verbose else "INFO")
    try:
        settings = MonitorSettings(
            redis_url=redis_url,
            metrics_port=metrics_port,
            metrics_addr=metrics_addr,
            crawls=crawls,
            webhook_url=webhook_url,
            webhook_format=webhook_format,
            webhook_secret=webhook_secret,
            backlog_threshold=backlog_threshold,
            interval_s=interval,
            cache_s=cache_seconds,
            max_sites=max_sites,
            index_sites=index_sites,
            sweep_sites=sweep_sites,
            dlq_quiet_s=dlq_quiet_seconds,
            send_resolved=send_resolved,
            events=events,
            connect_timeout_s=connect_timeout,
            allow_eviction=allow_eviction,
            burst=burst,
            state_file=state_file,
            worker_rate=worker_rate,
            scale_horizon_s=scale_horizon_seconds,
            max_workers=max_workers,
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    serve(PROG, Monitor(settings))


if __name__ == "__main__":  # pragma: no cover
    main()
