"""Reply values as Python text.

Each script's reply parser lives with the script (:mod:`streams_sched.frontier.scripts`).
"""

from __future__ import annotations

from streams_sched.connect.server_checks import text

__all__ = ["text"]
