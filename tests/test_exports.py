"""The public API is what __all__ says, and every name in it exists."""

from __future__ import annotations

import streams_sched


def test_all_names_exist_and_are_public() -> None:
    """Every name in streams_sched.__all__ is importable from the package."""
    for name in streams_sched.__all__:
        assert hasattr(streams_sched, name), name
    assert streams_sched.StreamsScheduler.__module__ == "streams_sched.worker.scheduler"
    from streams_sched.scheduler import StreamsScheduler  # the SCHEDULER path projects name

    assert StreamsScheduler is streams_sched.StreamsScheduler
    assert streams_sched.Seeder.__module__.startswith("streams_sched.frontier.seeding")
    assert {"Seeder", "SeedResult", "seed"} <= set(streams_sched.__all__)


def test_one_root_exception() -> None:
    """Every exception streams-sched raises derives from StreamsSchedError."""
    errors = [getattr(streams_sched, n) for n in streams_sched.__all__ if n.endswith("Error") or n in ("RedisUnavailable", "RequestsRefused")]
    assert all(issubclass(e, streams_sched.StreamsSchedError) for e in errors)


def test_the_daemons_and_the_cli_load_without_scrapy() -> None:
    """The package, the reclaimer and monitor daemons and the CLI load without importing
    Scrapy (the scheduler is loaded on first use), as streams_sched/__init__.py says."""
    import subprocess
    import sys

    probe = "import sys, {}; print('scrapy' in sys.modules)"
    for module, imports_scrapy in (("streams_sched", False), ("reclaimer.__main__", False),
                                   ("monitor.__main__", False), ("streams_sched.cli", False)):
        out = subprocess.run([sys.executable, "-c", probe.format(module)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == str(imports_scrapy), module
