"""How many requests the scheduler hands the engine per turn of the event loop.

The engine asks for requests until its downloader is full, so a batch of leases would
start a few hundred downloads in one turn, and their responses, coroutines and
Deferreds would then live side by side: Python's garbage collector finds them in every
young collection, promotes them, and runs full collections over the whole heap again and
again. Handed out a few at a time, each turn's work is done before the next starts. On
a CPU-bound crawl of one-page sites that took the worker from about 1.2 to about 0.7 ms
of CPU per page (``python -m bench sites``); with real downloads it only spreads the
ramp-up over more turns. An engine turned away in a turn is asked to pull again at the
next one (engine.py, ``EngineHooks.next_turn`` and ``pull``).
"""

from __future__ import annotations

from streams_sched.worker.engine import EngineHooks

__all__ = ["HANDOUT_PER_TURN", "TurnBudget"]

#: requests handed to the engine per turn of the event loop
HANDOUT_PER_TURN = 4


class TurnBudget:
    """The requests left to hand out in this turn of the event loop."""

    __slots__ = ("handed", "hooks", "per_turn", "turned_away")

    def __init__(self, per_turn: int = HANDOUT_PER_TURN) -> None:
        self.per_turn = per_turn
        self.hooks: EngineHooks | None = None
        self.handed = 0
        self.turned_away = False

    def spent(self) -> bool:
        """True (and the engine is pulled again next turn) once this turn's requests are out."""
        if self.hooks is not None and self.handed >= self.per_turn:
            self.turned_away = True
            return True
        return False

    def take(self) -> None:
        """One request goes out in this turn."""
        hooks = self.hooks
        if hooks is None:
            return
        if self.handed == 0:
            hooks.next_turn(self._new_turn)
        self.handed += 1

    def _new_turn(self) -> None:
        self.handed = 0
        if self.turned_away and self.hooks is not None:
            self.turned_away = False
            self.hooks.pull()
