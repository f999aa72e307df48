"""What every command shares: the connection options, the Redis client, and errors as exit codes.

``shared_options`` adds ``--redis-url`` and ``--crawl``, ``redis_option`` only
``--redis-url``; both wrap the command in ``handle_errors``, which turns the
library's and Redis' errors into one ``error:`` line and a documented exit code
(:mod:`streams_sched.exit_codes`). The commands that add requests to a crawl (push,
dlq requeue, migrate-scrapy-redis) connect with ``connect_for_writes``, which checks
the eviction policy first, and take ``--allow-eviction`` (``allow_eviction_option``):
on an ``allkeys-*`` Redis what they add could vanish. Those that only read, delete
(purge, the fix for a full Redis) or steer a crawl (site set, pause, resume: an
operator may need them most on a Redis in trouble) do not check.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import click
import redis

from streams_sched.connect.clients import connect_ready, redact
from streams_sched.connect.server_checks import check_eviction, hint_for
from streams_sched.errors import CrawlMoved, RedisUnavailable, StreamsSchedError
from streams_sched.exit_codes import EXIT_ERROR, EXIT_MOVED, EXIT_UNREACHABLE
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import CrawlKeys, validate_crawl_name
from streams_sched.frontier.moves import moved_in_error

__all__ = [
    "CliError",
    "allow_eviction_option",
    "connect",
    "connect_for_writes",
    "handle_errors",
    "known_crawl",
    "load_fingerprinter",
    "redis_option",
    "shared_options",
]

#: default of --redis-url (env REDIS_URL)
DEFAULT_REDIS_URL = "redis://localhost:6379/0"


class CliError(click.ClickException):
    """An error a script can rely on: one ``error:`` line on stderr and a documented exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def connect(url: str) -> Any:
    """A client whose Redis answered within STREAMS_CONNECT_TIMEOUT_SECONDS (default 3)."""
    try:
        timeout_s = float(os.environ.get("STREAMS_CONNECT_TIMEOUT_SECONDS", "3"))
    except ValueError:
        timeout_s = 3.0
    return connect_ready(url, timeout_s, setting="--redis-url", quiet=True)


#: how the CLI names its allow-eviction option in the refusal
ALLOW_EVICTION_HINT = "add --allow-eviction (or set STREAMS_ALLOW_EVICTION=1)"


def connect_for_writes(url: str, allow_eviction: bool) -> Any:
    """:func:`connect`, then the eviction-policy check: an ``allkeys-*`` Redis is refused
    (one ``error:`` line, exit 1) unless ``allow_eviction``; a warning is one ``warning:`` line."""
    client = connect(url)
    check_eviction(
        client, f"Redis at {redact(url)}", allowed=allow_eviction, allow_hint=ALLOW_EVICTION_HINT,
        warn=lambda message: click.echo(f"warning: {message}", err=True),
    )
    return client


def allow_eviction_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--allow-eviction (env STREAMS_ALLOW_EVICTION) for the commands that write."""
    return click.option(
        "--allow-eviction", is_flag=True, envvar="STREAMS_ALLOW_EVICTION",
        help="Write even to a Redis whose maxmemory-policy is allkeys-* (it evicts queued requests silently).",
    )(func)


def known_crawl(client: Any, crawl: str, redis_url: str) -> Frontier:
    """The crawl's Frontier, or a CliError if no such crawl is registered."""
    frontier = Frontier(client, crawl)
    if not client.sismember(CrawlKeys.registry(), crawl):
        raise CliError(f"no crawl named {crawl!r} in {redact(redis_url)} (see: streams-sched crawls)")
    return frontier


def _cluster_down(url: str | None) -> str | None:
    """Why the cluster of ``url`` is down (connect/cluster_health.py), or None."""
    if not url:
        return None
    from streams_sched.connect.cluster_health import cluster_down_line

    try:
        return cluster_down_line(url=url)
    except Exception:  # no node answers: nothing better to say
        return None


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's and Redis' errors into one line and a documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RedisUnavailable as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None
        except CrawlMoved as exc:
            raise CliError(str(exc), EXIT_MOVED) from None
        except StreamsSchedError as exc:
            raise CliError(str(exc)) from None
        except (redis.exceptions.ClusterDownError, redis.exceptions.RedisClusterException) as exc:
            # the nodes answer, but a slot has no master: say which and why, not "unreachable"
            down = _cluster_down(kwargs.get("redis_url"))
            raise CliError(down or f"Redis Cluster: {' '.join(str(exc).split())}", EXIT_UNREACHABLE) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            down = _cluster_down(kwargs.get("redis_url"))
            raise CliError(down or f"lost the connection to Redis: {exc}", EXIT_UNREACHABLE) from None
        except redis.ResponseError as exc:
            to = moved_in_error(exc)
            if to is not None:
                raise CliError(str(CrawlMoved(kwargs.get("crawl") or "?", to)), EXIT_MOVED) from None
            # one line that names the Redis setting to fix (maxmemory, stop-writes-on-bgsave-error)
            # or, from a replica, the URL; exit 1 like any refusal
            hint = hint_for(str(exc), "worker", "--redis-url (REDIS_URL)")
            raise CliError(f"Redis refused: {' '.join(str(exc).split())}" + (f" ({hint})" if hint else "")) from None

    return wrapper


def shared_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url and --crawl for every command that works on one crawl."""

    @click.option("--redis-url", envvar="REDIS_URL", default=DEFAULT_REDIS_URL, show_default=True, help="Redis of the frontier (env REDIS_URL).")
    @click.option("--crawl", "-c", envvar="STREAMS_PREFIX", required=True, help="Crawl namespace (STREAMS_PREFIX; usually the spider name).")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            validate_crawl_name(kwargs["crawl"], "--crawl")
        except StreamsSchedError as exc:
            raise click.BadParameter(str(exc), param_hint="--crawl") from None
        return handle_errors(func)(*args, **kwargs)

    return wrapper


def redis_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """--redis-url for commands that are not about one crawl."""

    @click.option("--redis-url", envvar="REDIS_URL", default=DEFAULT_REDIS_URL, show_default=True, help="Redis of the frontier (env REDIS_URL).")
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handle_errors(func)(*args, **kwargs)

    return wrapper


def load_fingerprinter(path: str) -> Any:
    """An instance of the fingerprinter class at ``path`` (--fingerprinter of push, load and
    url), built as Scrapy builds REQUEST_FINGERPRINTER_CLASS: through its ``from_crawler`` if
    it has one, with the settings of the Scrapy project the command runs in (``SCRAPY_SETTINGS_MODULE`` or
    ``scrapy.cfg``; Scrapy's defaults outside a project), else without arguments."""
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.utils.misc import build_from_crawler, load_object
    from scrapy.utils.project import get_project_settings

    try:
        cls = load_object(path)
        return build_from_crawler(cls, Crawler(Spider, get_project_settings()))
    except Exception as exc:
        raise click.BadParameter(f"{path}: {type(exc).__name__}: {exc}", param_hint="--fingerprinter") from None
