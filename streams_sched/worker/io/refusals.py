"""Commands Redis refuses for good (NOPERM, WRONGTYPE, OOM, MISCONF, READONLY), logged once each, not once a cycle.

A refused enqueue or ack is sent again every cycle (nothing may be lost), and
would otherwise log an ERROR each time. :class:`Refusals` counts each distinct
refusal, says which ones to log (the first of each), and which ended when
the same command goes through again.

A refusal of every write (OOM at maxmemory, MISCONF after a failed snapshot, READONLY
from a replica: connect/writable.py) is one refusal for the whole server, whatever
was refused: every write is refused (enqueues, acks, feedback, heartbeats, each
site's) and the operator's fix is the same, so it is logged once. Memory hovers at
the limit while acks free some of it, so a command refused one cycle goes through
the next: such an episode ends only when a command it refused goes through
``quiet_s`` seconds after its last refusal, not at the first command that goes through.

Pure data, no Redis; the I/O thread also backs off while any refusal lasts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from streams_sched.connect.server_checks import refuses_writes

__all__ = ["OOM_QUIET_S", "Refusals"]

#: an episode of refused writes ends this long after its last refusal (see the module docstring)
OOM_QUIET_S = 30.0
#: the "what" of the one refusal of every write
_SERVER = "Redis"


@dataclass(slots=True)
class _Episode:
    """An episode of refused writes (one code): what it refused, how often, and when last."""

    whats: set[str]
    count: int
    error: str
    last: float


@dataclass(slots=True)
class Refusals:
    """Distinct refusals (what was refused, Redis's message) and how often each came."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    quiet_s: float = OOM_QUIET_S
    #: per code of REFUSES_WRITES, while its episode lasts
    _episodes: dict[str, _Episode] = field(default_factory=dict)

    def note(self, what: str, error: BaseException | str, now: float | None = None) -> bool:
        """Count one refusal; True if it is new (log it). ``now``: a monotonic clock."""
        message = str(error)
        code = refuses_writes(message)
        if code:
            now = time.monotonic() if now is None else now
            episode = self._episodes.get(code)
            new = episode is None
            if episode is None:
                episode = self._episodes[code] = _Episode(set(), 0, message, now)
            episode.whats.add(what)
            episode.count += 1
            episode.last = now
            self.counts[(_SERVER, code)] = episode.count
            return new
        key = (what, message)
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return n == 0

    def accepted(self, what: str, now: float | None = None) -> list[tuple[str, int]]:
        """Redis did ``what`` again: the (error, count) of its refusals, now forgotten
        (an episode of refused writes only once it is over, see the module docstring)."""
        ended = [(error, n) for (w, error), n in self.counts.items() if w == what]
        for error, _ in ended:
            del self.counts[(what, error)]
        for code, episode in list(self._episodes.items()):
            if what not in episode.whats:
                continue
            now = time.monotonic() if now is None else now
            if now - episode.last >= self.quiet_s:
                ended.append((episode.error, episode.count))
                del self.counts[(_SERVER, code)]
                del self._episodes[code]
        return ended

    def __bool__(self) -> bool:
        return bool(self.counts)
