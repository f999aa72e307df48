"""Commands Redis refuses for good (NOPERM, WRONGTYPE), logged once each, not once a cycle.

A refused enqueue or ack is sent again every cycle (nothing may be lost), and
would otherwise log an ERROR each time. :class:`Refusals` counts each distinct
refusal, says which ones to log (the first of each), and which ended when
the same command goes through again.
Pure data, no Redis; the I/O thread also backs off while any refusal lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Refusals"]


@dataclass(slots=True)
class Refusals:
    """Distinct refusals (what was refused, Redis's message) and how often each came."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def note(self, what: str, error: BaseException | str) -> bool:
        """Count one refusal; True if it is new (log it)."""
        key = (what, str(error))
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return n == 0

    def accepted(self, what: str) -> list[tuple[str, int]]:
        """Redis did ``what`` again: the (error, count) of its refusals, now forgotten."""
        ended = [(error, n) for (w, error), n in self.counts.items() if w == what]
        for error, _ in ended:
            del self.counts[(what, error)]
        return ended

    def __bool__(self) -> bool:
        return bool(self.counts)
