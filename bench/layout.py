"""Importing from the streams_sched under test, whichever package layout its revision has.

A ``KIND@REV`` run (bench/revision.py) runs workers and seeding steps with streams_sched
taken from revision REV, which may have the flat layout (``streams_sched.pump``) or the
subpackages (``streams_sched.worker.io.pump``, later ``streams_sched.worker.io.cycle``).
Bench code names each.
"""

from __future__ import annotations

import importlib
from typing import Any


def first(*paths: str) -> Any:
    """The first of these modules that the streams_sched on sys.path has."""
    for path in paths[:-1]:
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError:
            continue
    return importlib.import_module(paths[-1])
