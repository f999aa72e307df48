"""The exit code of a worker's process when its crawl has moved (``STREAMS_EXIT_ON_MOVE``).

Scrapy has no way for a component to set the exit code of ``scrapy crawl`` (engine.py
says so for code 1). A worker whose crawl moved closes its spider like any other, and
Scrapy ends the process with 0; so the worker asks, once, for a handler run when the
interpreter ends, after Scrapy returned its code and every thread was joined, that
flushes the logs and standard streams and ends the process with ``code``. Handlers
registered before it (none of Scrapy's or streams-sched's) do not run.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

__all__ = ["exit_with_at_end"]

_asked: list[int] = []


def exit_with_at_end(code: int) -> None:
    """End the process with ``code`` when the interpreter ends (the first code asked wins)."""
    if _asked:
        return
    _asked.append(code)
    atexit.register(_exit)


def _exit() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing more to say
            pass
    os._exit(_asked[0])
