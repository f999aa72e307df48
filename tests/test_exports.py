"""The public API is what __all__ says, and every name in it exists."""

from __future__ import annotations

import streams_sched


def test_all_names_exist_and_are_public() -> None:
    """Every name in streams_sched.__all__ is importable from the package."""
    for name in streams_sched.__all__:
        assert hasattr(streams_sched, name), name
    assert streams_sched.StreamsScheduler.__module__ == "streams_sched.scheduler"
    assert streams_sched.Seeder.__module__ == "streams_sched.seeding"
    assert {"Seeder", "SeedResult", "seed"} <= set(streams_sched.__all__)


def test_one_root_exception() -> None:
    """Every exception streams-sched raises derives from StreamsSchedError."""
    errors = [getattr(streams_sched, n) for n in streams_sched.__all__ if n.endswith("Error") or n in ("RedisUnavailable", "RequestsRefused")]
    assert all(issubclass(e, streams_sched.StreamsSchedError) for e in errors)
