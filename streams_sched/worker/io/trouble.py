"""What the I/O thread does when Redis is away or refuses: back off, log once, say when it ends.

Redis unreachable: the cycle is retried with back-off and the unsent operations wait.
A WARNING says so at once; once it has lasted longer than a lease (the worker's leases
are then being taken over by others), an ERROR names every server it tried, and a
one-line summary follows every minute while it lasts, so an outage is never silent.
A Redis Cluster whose nodes answer but which is down (CLUSTERDOWN: a slot has no
master) is not unreachable: then the ERROR and each summary say which slots have no
master, which master failed and why Redis does not promote its replica
(connect/cluster_health.py), and nothing about addresses.
How long it has lasted is on the Exchange (``unreachable_since``) for the metrics.
Redis refusing a command for good (NOPERM, WRONGTYPE; OOM at maxmemory, MISCONF after a
failed snapshot, READONLY from a replica): the operation is kept and retried with the same
back-off, and each distinct refusal is logged once (refusals.py; a refusal of every write
once for all commands) with what to do about it
(server_checks.hint_for), its repeats counted in ``streams/redis_errors``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from streams_sched.connect.backoff import Backoff
from streams_sched.connect.server_checks import hint_for, refuses_writes
from streams_sched.connect.waiting import one_line
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.refusals import Refusals

__all__ = ["OUTAGE_SUMMARY_S", "RETRY_INITIAL_S", "RETRY_MAX_S", "Trouble"]

logger = logging.getLogger(__name__)

#: first and longest wait before trying a failed cycle again
RETRY_INITIAL_S, RETRY_MAX_S = 0.1, 5.0
#: how often a long outage repeats its one-line summary
OUTAGE_SUMMARY_S = 60.0


#: how the warning that ends an episode of refused writes names its cause
_REFUSED_AS = {"OOM": "at maxmemory", "MISCONF": "after a failed RDB snapshot", "READONLY": "as a read-only replica"}


class Trouble:
    """Outages and refusals of one I/O thread, and the back-off they cause."""

    def __init__(
        self,
        x: Exchange,
        on_outage: Callable[[], None],
        *,
        tried: Callable[[], str] = lambda: "Redis",
        escalate_after_s: float = 300.0,
        diagnose: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``tried`` names the servers the client tries (for the log lines);
        ``escalate_after_s`` is how long an outage lasts before it is an ERROR (a lease);
        ``diagnose`` says why a cluster whose nodes answer is down (None: it is not)."""
        self.exchange = x
        self.retry = Backoff(initial_s=RETRY_INITIAL_S, max_s=RETRY_MAX_S)
        self.outage_since: float | None = None
        self.tried = tried
        self.escalate_after_s = escalate_after_s
        #: when the outage's ERROR or last summary was logged (None: not yet)
        self._told: float | None = None
        self._failures = 0
        self.refusals = Refusals()
        #: a command was refused in this cycle: back off before the next
        self.refused = False
        self.on_outage = on_outage
        self.diagnose = diagnose

    def outage(self, exc: BaseException, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.outage_since is None:
            self.outage_since = now
            self.exchange.unreachable_since = now
            self._failures = 0
            logger.warning("Redis unreachable (%s); retrying with back-off", exc)
        self._failures += 1
        self.exchange.stats.append(("streams/redis_errors", 1))
        self.on_outage()
        lasted = now - self.outage_since
        due = (self._told is None and lasted >= self.escalate_after_s) or (
            self._told is not None and now - self._told >= OUTAGE_SUMMARY_S
        )
        if not due:
            return
        first, self._told = self._told is None, now
        down = self._diagnosis()
        if down:
            logger.error(
                "streams-sched: for %.0fs, %s. Its leases expire and go to other workers; its %d unsent"
                " operations wait here (said again every %.0fs while this lasts)",
                lasted, down, len(self.exchange.outbox), OUTAGE_SUMMARY_S,
            )
        elif first:
            logger.error(
                "streams-sched has reached no Redis server of its crawl for %.0fs (tried %s; last error: %s)."
                " Its leases expire and go to other workers; its %d unsent operations wait here. Check that"
                " these servers run and that REDIS_URL names them (it may name several nodes of a cluster)."
                " A summary follows every %.0fs while this lasts",
                lasted, self.tried(), one_line(exc), len(self.exchange.outbox), OUTAGE_SUMMARY_S,
            )
        else:
            logger.error(
                "streams-sched: still no Redis after %.0fs (%d tries; tried %s; last error: %s)",
                lasted, self._failures, self.tried(), one_line(exc),
            )

    def _diagnosis(self) -> str | None:
        try:
            return self.diagnose()
        except Exception as exc:  # the question failed too: say what the client saw
            logger.debug("cannot tell why the cluster is down: %s", exc)
            return None

    def reachable(self) -> bool:
        """The cycle went through: True if that ends an outage."""
        if self.outage_since is None:
            return False
        lasted = time.monotonic() - self.outage_since
        log = logger.error if self._told is not None else logger.warning
        log("Redis is reachable again after %.1fs", lasted)
        self.outage_since = None
        self.exchange.unreachable_since = None
        self._told = None
        return True

    def refuse(self, what: str, exc: BaseException, *, back_off: bool = True) -> None:
        """Redis refused a command for good: count it, log it the first time, and (for
        what must be sent again: enqueues, acks) back off the next cycle."""
        self.refused = self.refused or back_off
        self.exchange.stats.append(("streams/redis_errors", 1))
        if self.refusals.note(what, exc):
            hint = hint_for(str(exc))
            logger.error(
                "Redis refused the %s: %s. Retrying with back-off; not logged again until it"
                " clears (streams/redis_errors counts every refusal)%s",
                what, str(exc).rstrip("."), f". {hint[0].upper()}{hint[1:]}" if hint else "",
            )

    def accepted(self, what: str) -> None:
        if not self.refusals.counts:
            return
        for error, n in self.refusals.accepted(what):
            code = refuses_writes(error)
            if code:
                logger.warning(
                    "Redis accepts writes again (no %s for %gs), after refusing %d commands %s",
                    code, self.refusals.quiet_s, n, _REFUSED_AS[code],
                )
            else:
                logger.warning("Redis accepts the %s again, after refusing it %d times (%s)", what, n, error)

    def delay(self, failed: bool) -> float:
        """How long to wait before the next cycle."""
        if failed or self.refused:
            return self.retry.next()
        self.retry.reset()
        return 0.0
