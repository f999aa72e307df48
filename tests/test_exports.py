"""The public API is what __all__ says, and every name in it exists."""

from __future__ import annotations

import pytest

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


@pytest.mark.e2e
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


PUBLIC_API = [
    "ConfigError",
    "DedupeBackendError",
    "EntryError",
    "EvictionPolicyError",
    "MetaCodec",
    "RedisUnavailable",
    "RequestsRefused",
    "ScrapyCompatError",
    "SeedResult",
    "Seeder",
    "SerializationError",
    "StreamsConfig",
    "StreamsSchedError",
    "StreamsScheduler",
    "__version__",
    "pause_site",
    "register_meta_codec",
    "resume_site",
    "seed",
    "set_policy",
]
INTERNALS = ["BloomParams", "CrawlKeys", "Frontier", "SiteKeys"]


def test_all_is_the_public_api_and_no_internals() -> None:
    """streams_sched.__all__ is exactly the user-facing list, each name resolves, and no internal is exported."""
    assert sorted(streams_sched.__all__) == sorted(PUBLIC_API)
    for name in PUBLIC_API:
        assert getattr(streams_sched, name) is not None, name
    for name in INTERNALS:
        assert name not in streams_sched.__all__, name
        assert not hasattr(streams_sched, name), name
    from streams_sched.frontier.client import Frontier
    from streams_sched.frontier.keys import CrawlKeys, SiteKeys
    from streams_sched.frontier.records import BloomParams

    assert all((Frontier, CrawlKeys, SiteKeys, BloomParams))


def test_errors_docstring_draws_every_subclass_of_the_root() -> None:
    """Every StreamsSchedError subclass defined anywhere in the package is named in the errors.py tree."""
    import importlib
    import inspect
    import pkgutil
    import re

    from streams_sched import errors

    found: set[str] = set()
    for info in pkgutil.walk_packages(streams_sched.__path__, prefix="streams_sched."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and obj.__module__.startswith("streams_sched")
                    and issubclass(obj, errors.StreamsSchedError)):
                found.add(obj.__name__)
    doc = errors.__doc__ or ""
    drawn = set(re.findall(r"[├└]── (\w+)", doc)) | set(re.findall(r"^\s*(StreamsSchedError)\s*$", doc, re.M))
    assert {"StreamsSchedError", "PickleRefused", "RequestsRefused"} <= found
    assert found - drawn == set()
