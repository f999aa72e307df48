"""``python -m streams_sched.cli``: the same as the ``streams-sched`` command."""

from __future__ import annotations

from . import main

main()
