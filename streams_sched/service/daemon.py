"""Plumbing shared by the daemons (``reclaimer``, ``monitor``).

- :func:`configure_logging`: structlog, one JSON object per line on stderr
  (or a console format), with the standard library's records (redis-py,
  streams_sched modules) rendered the same way;
- :class:`StopFlag`: SIGTERM / SIGINT set a flag that the loop checks between
  passes, and wake its sleep at once;
- :class:`~streams_sched.connect.backoff.Backoff`: growing delays while Redis is unreachable;
- :func:`connect_at_start`: a client whose Redis answered, or one clear error;
- :func:`check_server`: the eviction-policy check at start (:mod:`streams_sched.connect.server_checks`),
  waited for while Redis refuses even that (MISCONF);
- :func:`run_passes`: the loop both daemons run (a pass every interval, back-off
  while Redis fails or refuses, each kind of refusal logged once, SIGTERM between
  passes, ``--burst``);
- :func:`serve`: a daemon's life in its command line, from connecting to the
  exit code, and :func:`fail`, the one line on stderr before an error exit.

Exit codes of every daemon and of ``streams-sched``: see :mod:`streams_sched.exit_codes`
(re-exported here for the daemons).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn, Protocol

import click
import structlog
from redis.exceptions import ResponseError

from streams_sched.connect.backoff import Backoff
from streams_sched.connect.clients import TRANSIENT as CONNECTION_TRANSIENT
from streams_sched.connect.clients import redact
from streams_sched.connect.server_checks import (
    REFUSES_WRITES,
    check_eviction,
    error_code,
    hint_for,
    refuses_writes,
)
from streams_sched.connect.writable import WriteWait, connect_answering
from streams_sched.errors import CrawlMoved, RedisUnavailable, StreamsSchedError
from streams_sched.exit_codes import (
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_MOVED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from streams_sched.service.metrics_server import MetricsServer

__all__ = [
    "EXIT_CODES",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "TRANSIENT",
    "ALLOW_EVICTION_OPTION",
    "Backoff",
    "MetricsServer",
    "StopFlag",
    "check_server",
    "configure_logging",
    "connect_at_start",
    "fail",
    "refused_line",
    "run_passes",
    "serve",
]

#: Errors that mean "Redis is not answering": retry with back-off.
TRANSIENT = CONNECTION_TRANSIENT  # one list for workers, daemons and the CLI


def configure_logging(fmt: str = "json", level: str = "INFO") -> None:
    """Configure structlog and the standard library logging for a daemon."""
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processor=renderer,
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, structlog.processors.format_exc_info],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)


class StopFlag:
    """Set by SIGTERM or SIGINT (or :meth:`set`); :meth:`wait` sleeps until it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal: int | None = None

    def install(self) -> None:
        """Handle SIGTERM and SIGINT (main thread only)."""
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum
        self._event.set()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s``; True if the flag was set meanwhile."""
        return self._event.wait(max(0.0, timeout_s))


def run_passes(
    one_pass: Callable[[], object],
    *,
    interval_s: float,
    burst: bool,
    stop_flag: StopFlag,
    max_backoff_s: float,
    log: Any,
    hint: str,
    role: str = "worker",
    on_error: Callable[[], object] = lambda: None,
    diagnose: Callable[[], str | None] = lambda: None,
) -> int:
    """Run ``one_pass`` every ``interval_s`` until ``stop_flag`` is set; the exit code.

    A pass that fails on Redis is retried with back-off. Unreachable: a
    ``redis_unreachable`` warning each time, ``redis_reachable_again`` once a pass works.
    A command refused (OOM, MISCONF or READONLY for every write, a NOPERM, ...): one
    ``redis_refused`` ERROR per kind of refusal, with ``hint`` after what the refusal asks
    of an operator (:func:`~streams_sched.connect.server_checks.hint_for`, with ``role``
    the daemon's ACL role); the repeats only count (``on_error``), and the first pass that
    works logs ``redis_accepts_writes_again`` (or ``redis_refusals_ended``) with how many.
    With ``burst`` it runs one pass: 0 if it worked, 1 (``pass_failed``) if not.
    A Redis Cluster whose nodes answer but which is down (a slot without a master) is not
    unreachable: ``diagnose`` says why (connect/cluster_health.py), logged as one
    ``redis_cluster_down`` ERROR once it has lasted :data:`CLUSTER_DOWN_AFTER_S`, and
    again every :data:`CLUSTER_DOWN_EVERY_S` while it lasts.
    """
    backoff = Backoff(max_s=max_backoff_s)
    refusals = WriteWait()
    unreachable = False
    told_down: float | None = None
    while not stop_flag.is_set():
        started = time.monotonic()
        try:
            one_pass()
        except TRANSIENT + (ResponseError,) as exc:
            on_error()
            refused = not isinstance(exc, TRANSIENT)
            advice = "; ".join(h for h in (hint_for(str(exc), role, URL_SETTING), hint) if h) if refused else hint
            down = None
            if not refused and (burst or backoff.failing_s >= CLUSTER_DOWN_AFTER_S) and (
                told_down is None or time.monotonic() - told_down >= CLUSTER_DOWN_EVERY_S
            ):
                down = _diagnosis(diagnose)
                if down:
                    told_down = time.monotonic()
                    log.error("redis_cluster_down", diagnosis=down, down_for_s=round(backoff.failing_s, 1))
            if burst:
                log.error("pass_failed", error=str(exc), hint=down or advice)
                return EXIT_ERROR
            delay = backoff.next()
            if not refused:
                unreachable = True
                log.warning("redis_unreachable", error=str(exc), retry_in_s=delay,
                            down_for_s=round(backoff.failing_s, 1), hint=hint)
            elif refusals.refuse(error_code(str(exc)) or str(exc)):
                log.error("redis_refused", error=str(exc), retry_in_s=delay, hint=advice,
                          repeats="not logged again until it clears; counted in the errors metric")
            if stop_flag.wait(delay):
                return EXIT_OK
            continue
        if backoff.since is not None:
            lasted = round(backoff.reset(), 1)
            writes = any(kind in REFUSES_WRITES for kind in refusals.said)
            ended = refusals.accepted()
            if ended is not None:
                log.warning("redis_accepts_writes_again" if writes else "redis_refusals_ended", after_s=lasted, refused=ended[1])
            if unreachable:
                log.warning("redis_reachable_again", after_s=lasted)
            unreachable = False
            told_down = None
        if burst or stop_flag.wait(interval_s - (time.monotonic() - started)):
            return EXIT_OK
    return EXIT_OK


#: how long a daemon's passes fail before it asks whether the cluster is down (a
#: failover's own seconds of CLUSTERDOWN are no fault), and how often it says so again
CLUSTER_DOWN_AFTER_S, CLUSTER_DOWN_EVERY_S = 10.0, 60.0


def _diagnosis(diagnose: Callable[[], str | None]) -> str | None:
    try:
        return diagnose()
    except Exception:  # the question failed too: the unreachable warning stands
        return None


class Daemon(Protocol):
    """What :func:`serve` needs of a daemon (``reclaimer.Reclaimer``, ``monitor.Monitor``)."""

    client: Any
    stop_flag: StopFlag

    def connect(self) -> None: ...

    def run(self) -> int: ...

    def close(self) -> None: ...


def fail(prog: str, message: str, code: int) -> NoReturn:
    """``PROG: error: MESSAGE`` on stderr, then exit with ``code``."""
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


def serve(prog: str, daemon: Daemon) -> NoReturn:
    """Connect, handle SIGTERM/SIGINT, run until stopped, close, exit with the code.

    Redis unreachable at start exits 3; every crawl it looks after moved to another Redis
    (``streams-sched move``) exits 6; an evicting Redis (allkeys-*, see
    :func:`check_server`) and a port or file that cannot be used exit 1; each with
    one line on stderr.
    """
    code = EXIT_ERROR
    try:
        daemon.stop_flag.install()  # before connecting: a start that waits (check_server) can be stopped
        daemon.connect()
        code = daemon.run()
    except RedisUnavailable as exc:
        fail(prog, str(exc), EXIT_UNREACHABLE)
    except CrawlMoved as exc:  # every crawl it looks after has moved (service/moves.py)
        click.echo(f"{prog}: {exc}", err=True)
        code = EXIT_MOVED
    except StreamsSchedError as exc:  # the server's eviction policy (check_server)
        fail(prog, str(exc), EXIT_ERROR)
    except OSError as exc:
        fail(prog, str(exc), EXIT_ERROR)
    except ResponseError as exc:  # refused at start, other than what check_server waits out
        fail(prog, refused_line(exc), EXIT_ERROR)
    finally:
        if daemon.client is not None:
            daemon.close()
    sys.exit(code)


#: how a daemon's refusal hints name where its Redis URL is set
URL_SETTING = "--redis-url (REDIS_URL)"


def refused_line(exc: ResponseError, role: str = "worker") -> str:
    """The one line for a command Redis refused: its error and what to do about it."""
    hint = hint_for(str(exc), role, URL_SETTING)
    return f"Redis refused: {exc}" + (f" ({hint})" if hint else "")


def connect_at_start(url: str, timeout_s: float, setting: str = "--redis-url") -> Any:
    """A client for ``url`` whose Redis answered PING within ``timeout_s``.

    Retries quietly meanwhile, then raises :class:`RedisUnavailable` with one
    line that says what to check. Bad credentials, missing ACL rights and TLS
    certificate problems fail at once; a Redis Cluster that is not up yet is
    waited for too (see :func:`streams_sched.connect.clients.connect_ready`). A Redis
    that refuses writes answers (:func:`~streams_sched.connect.writable.connect_answering`).
    """
    return connect_answering(url, timeout_s, setting=setting, quiet=True)


#: how the daemons name their allow-eviction option in the refusal
ALLOW_EVICTION_OPTION = "start it with --allow-eviction (or STREAMS_ALLOW_EVICTION=1 in its environment)"


def check_server(client: Any, url: str, *, allowed: bool, log: Any, stop_flag: StopFlag | None = None) -> None:
    """The eviction-policy check at start: raises EvictionPolicyError on an allkeys-*
    Redis unless ``allowed``; a volatile-* policy (or ``allowed``) logs one
    ``eviction_policy`` warning.

    While a snapshot fails (MISCONF) Redis refuses even this read, since every new
    connection starts with PING: with ``stop_flag`` the check is tried again with
    back-off until it passes or the flag is set, after one ``redis_refused`` ERROR
    naming the fix."""
    wait = WriteWait()
    while True:
        try:
            check_eviction(
                client, f"Redis at {redact(url)}", allowed=allowed, allow_hint=ALLOW_EVICTION_OPTION,
                warn=lambda message: log.warning("eviction_policy", warning=message),
            )
            return
        except ResponseError as exc:
            if stop_flag is None or not refuses_writes(exc):
                raise
            if wait.refuse(refuses_writes(exc)):
                log.error("redis_refused", error=str(exc), hint=hint_for(str(exc), setting=URL_SETTING),
                          repeats="retrying with back-off; not logged again until it clears")
            if stop_flag.wait(wait.delay()):
                return
