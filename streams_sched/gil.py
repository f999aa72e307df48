"""The interpreter's thread switch interval while a scheduler is open.

A worker is one process with one GIL: the reactor thread runs Scrapy, the I/O
thread talks to Redis. When a Redis reply arrives, the I/O thread must wait
for the reactor to let go of the GIL, and a busy reactor lets go only every
``sys.getswitchinterval()``, 5 ms by default. On a CPU-bound crawl that wait
is paid after every reply, and the I/O thread then cannot lease fast enough
to keep the downloader full (``python -m bench sites``: 1 ms gave about 15%
more pages per second than 5 ms, and 20 ms a quarter of it).

So while at least one scheduler is open, the interval is ``STREAMS_GIL_SWITCH_MS``
(1 ms by default), unless the process chose an interval of its own; the last
scheduler to close puts Python's back.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["PYTHON_DEFAULT_S", "hold_switch_interval", "release_switch_interval"]

#: what CPython starts with
PYTHON_DEFAULT_S = 0.005

_lock = threading.Lock()
_holders = 0
_set_to: float | None = None


def hold_switch_interval(ms: float) -> bool:
    """Use ``ms`` as the switch interval while held (0 = leave it alone). Returns whether
    this call changed it; call :func:`release_switch_interval` once per True."""
    global _holders, _set_to
    if ms <= 0:
        return False
    with _lock:
        if _holders:
            _holders += 1
            return True
        if sys.getswitchinterval() != PYTHON_DEFAULT_S:
            return False  # the process chose its own
        _set_to = ms / 1000.0
        sys.setswitchinterval(_set_to)
        _holders = 1
        return True


def release_switch_interval() -> None:
    """The last holder puts Python's default back, unless someone changed it since."""
    global _holders, _set_to
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            if _set_to is not None and sys.getswitchinterval() == _set_to:
                sys.setswitchinterval(PYTHON_DEFAULT_S)
            _set_to = None
