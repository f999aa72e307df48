"""A Redis that answers but refuses every write: OOM, MISCONF, READONLY.

Such a server answers reads, so a component reaches it, but takes no write until an
operator acts:

- OOM: ``maxmemory`` reached under ``noeviction`` (or a ``volatile-*`` policy with no
  key left to evict);
- MISCONF: an RDB snapshot failed while ``stop-writes-on-bgsave-error`` is yes (the
  Redis default once ``save`` points are set). Redis then refuses PING too, so that
  health checks notice: a PING that draws MISCONF is an answer, not an outage;
- READONLY: the URL names a read-only replica instead of the primary.

The fix is the operator's and is the same whatever the command or key, so each kind is
said once for the whole server (the fix itself: :func:`~.server_checks.hint_for`), and
the component retries with back-off until writes go through: a worker's I/O thread
mid-crawl (``worker/io/refusals.py``), a worker at start (``worker/start_wait.py``), the
daemons' loop (``service/daemon.py``). :func:`connect_answering` connects to such a
server; :class:`WriteWait` is the back-off and the memory of what was said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from streams_sched.connect.backoff import Backoff
from streams_sched.connect.clients import connect, connect_ready
from streams_sched.connect.server_checks import refuses_writes

__all__ = ["WRITE_RETRY_INITIAL_S", "WRITE_RETRY_MAX_S", "WriteWait", "connect_answering"]

#: first and longest wait between tries while writes are refused (as the I/O thread's)
WRITE_RETRY_INITIAL_S, WRITE_RETRY_MAX_S = 0.1, 5.0


def connect_answering(url: str, timeout_s: float, **options: Any) -> Any:
    """:func:`~.clients.connect_ready`, where a PING refused for a failed snapshot
    (MISCONF) counts as the answer it is: the server is there, and what it refuses is
    writes, which the caller meets (and waits out) when it writes."""
    try:
        return connect_ready(url, timeout_s, **options)
    except ResponseError as exc:
        if refuses_writes(exc) != "MISCONF":
            raise
    built = {k: v for k, v in options.items() if k in ("socket_timeout", "connect_timeout", "decode_responses", "setting")}
    return connect(url, **built)


@dataclass
class WriteWait:
    """The refusals since writes last went through: the back-off between tries, the kinds
    (error codes) already said, how many tries were refused."""

    backoff: Backoff = field(default_factory=lambda: Backoff(initial_s=WRITE_RETRY_INITIAL_S, max_s=WRITE_RETRY_MAX_S))
    said: set[str] = field(default_factory=set)
    refused: int = 0

    def refuse(self, kind: str) -> bool:
        """Count one refused try; True if its ``kind`` is new (say it)."""
        self.refused += 1
        new = kind not in self.said
        self.said.add(kind)
        return new

    def delay(self) -> float:
        """How long to wait before the next try."""
        return self.backoff.next()

    def accepted(self) -> tuple[float, int] | None:
        """A try went through: (seconds since the first refusal, refused tries), or None
        if none was refused; then forget them."""
        if not self.refused:
            self.backoff.reset()
            return None
        ended = (self.backoff.reset(), self.refused)
        self.refused = 0
        self.said.clear()
        return ended
