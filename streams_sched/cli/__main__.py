"""``python -m streams_sched.cli``: the same as the ``streams-sched`` command."""

from __future__ import annotations

from streams_sched.cli import main

main()
