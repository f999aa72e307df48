"""Shift this process's wall clock by ``STREAMS_TEST_CLOCK_SKEW_S`` seconds (tests/test_clocks.py).

Python imports ``sitecustomize`` from sys.path as it starts. tests/helpers.py's ``Worker``
puts this directory on a worker's PYTHONPATH only when it is given a clock skew, so the
worker's ``time.time()`` and ``time.time_ns()`` say what they would on a machine whose
clock is that far off, from the first line it runs. Its monotonic clock, and Redis' clock,
are left alone, as they would be on such a machine. ``datetime.now()`` is not shifted:
nothing a worker sends to Redis reads it.
"""

from __future__ import annotations

import os
import time

_SKEW_S = float(os.environ.get("STREAMS_TEST_CLOCK_SKEW_S") or 0)

if _SKEW_S:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_SKEW_S * 1e9)

    def _skewed_time() -> float:
        return _time() + _SKEW_S

    def _skewed_time_ns() -> int:
        return _time_ns() + _skew_ns

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
