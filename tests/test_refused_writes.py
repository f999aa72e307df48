"""A worker, daemon or CLI started while Redis refuses every write: at maxmemory under
noeviction (OOM), after a failed RDB snapshot (MISCONF), or named by a URL that points
at a read-only replica (READONLY). Workers and daemons log one ERROR naming the setting
and the fix, retry with back-off, and work once Redis takes writes again; the CLI fails
with one line. Real redis-server processes, real workers and daemons."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from streams_sched.connect.clients import connect
from streams_sched.connect.server_checks import refuses_writes
from streams_sched.demo.web import SyntheticWeb
from streams_sched.exit_codes import EXIT_ERROR
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.testing import RedisServer, free_port

from daemons import Daemon
from helpers import ROOT, Worker, base_settings, crawled_urls, read_items, start_errors, wait_for

pytestmark = pytest.mark.e2e

KINDS = ("OOM", "MISCONF", "READONLY")

#: what each kind's line must name: the Redis setting (or the URL) and the fix
NAMED = {
    "OOM": ("maxmemory", "CONFIG SET maxmemory"),
    "MISCONF": ("stop-writes-on-bgsave-error", "BGSAVE"),
    "READONLY": ("names a read-only replica", "point it at the primary"),
}


class Refusing:
    """A Redis that refuses every write for one reason (``kind``), until :meth:`lift`."""

    def __init__(self, kind: str, url: str, admin: Any, lift: Callable[[], None]) -> None:
        self.kind = kind
        self.url = url
        self.admin = admin
        self.lift = lift

    def refusals(self) -> int:
        """Commands Redis refused with this kind's error since it started (INFO errorstats)."""
        return int(self.admin.info("errorstats").get(f"errorstat_{self.kind}", {}).get("count", 0))

    def refuses(self) -> bool:
        """True if a write is refused now, with this kind's error."""
        try:
            self.admin.set("probe", "1")
        except Exception as exc:
            return refuses_writes(exc) == self.kind
        self.admin.delete("probe")
        return False


@contextmanager
def refusing(kind: str) -> Iterator[Refusing]:
    """A fresh Redis that refuses writes with ``kind``, and how to make it take them again."""
    if kind == "OOM":
        with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as server:
            admin = connect(server.url)
            admin.set("filler", "x" * 100_000)
            admin.config_set("maxmemory", 1)  # below what it uses: every write is refused
            yield Refusing(kind, server.url, admin, lambda: admin.config_set("maxmemory", 0))
    elif kind == "MISCONF":
        # a save point makes stop-writes-on-bgsave-error count; a snapshot into a directory
        # that is gone fails (we are root: permissions would not stop it)
        with RedisServer(extra_args=["--save", "3600 1", "--enable-protected-configs", "yes"]) as server:
            admin = connect(server.url)
            gone = tempfile.mkdtemp(prefix="streams-sched-gone-")
            admin.config_set("dir", gone)
            os.rmdir(gone)
            admin.bgsave()
            wait_for(lambda: admin.info("persistence")["rdb_last_bgsave_status"] == "err", timeout=10,
                     what="the snapshot to fail")

            def lift() -> None:
                admin.config_set("dir", server.dir)
                admin.bgsave()

            try:
                yield Refusing(kind, server.url, admin, lift)
            finally:
                # a server that cannot save refuses SIGTERM's shutdown save, and its stop
                # would wait 10 s for it: let it stop without one
                admin.config_set("save", "")
    else:
        with RedisServer() as primary, RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]) as replica:
            admin = connect(replica.url)
            wait_for(lambda: admin.info("replication").get("master_link_status") == "up", timeout=20,
                     what="the replica to sync")
            yield Refusing(kind, replica.url, admin, lambda: admin.execute_command("REPLICAOF", "NO", "ONE"))
    admin.close()


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "] ERROR:" in line or "] CRITICAL:" in line]


# -- the worker ---------------------------------------------------------------------------


@pytest.mark.scrapy_matrix  # the scheduler's open returns a Deferred that Scrapy waits for
@pytest.mark.parametrize("kind", KINDS)
def test_worker_started_while_redis_refuses_writes_waits_then_crawls_everything(
    kind: str, crawl: str, tmp_path: Path, measured: Any,
) -> None:
    """A worker started on a Redis that refuses writes logs one ERROR naming the setting and the fix, retries, and once writes go through crawls every page and exits 0, with no traceback."""
    sites, pages = 2, 30
    items = tmp_path / "items.jsonl"
    with refusing(kind) as redis:
        assert redis.refuses()
        settings = base_settings(redis.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=sites, SYNTH_PAGES=pages)
        w = Worker(settings, tmp_path / "w.log")
        try:
            wait_for(lambda: error_lines(w.log()) or not w.alive(), timeout=60, what="the ERROR line")
            before = redis.refusals()
            # it keeps trying (back-off: 0.1 s doubling to 5 s), and says it only once
            wait_for(lambda: redis.refusals() >= before + 3, timeout=30, what="three more refused tries")
            assert w.alive(), w.log()
            assert read_items(items) == [] and len(error_lines(w.log())) == 1, w.log()
            waited = time.monotonic()
            redis.lift()
            assert w.wait(120) == 0, w.log()
            waited = time.monotonic() - waited
        finally:
            w.close()
        refused = redis.refusals()
    log = w.log_path.read_text(errors="replace")
    errors = error_lines(log)
    assert len(errors) == 1, errors
    assert "streams-sched cannot start yet" in errors[0] and f"Redis at {redis.url}" in errors[0]
    assert all(word in errors[0] for word in NAMED[kind]), errors[0]
    assert "Traceback" not in log
    assert "accepts writes again" in log and "streams-sched starts" in log
    assert set(crawled_urls(items)) == SyntheticWeb(sites=sites, pages=pages).all_urls()
    measured(f"{kind}: {refused} commands refused while it waited; crawled {len(crawled_urls(items))}/{sites * pages},"
             f" exit 0 {waited:.1f}s after the fix, one ERROR line")


@pytest.mark.scrapy_matrix
def test_worker_stopped_while_waiting_exits_at_once(crawl: str, tmp_path: Path) -> None:
    """SIGTERM while the worker waits for Redis to accept writes stops it within seconds, exit 0, with nothing written."""
    items = tmp_path / "items.jsonl"
    with refusing("OOM") as redis:
        w = Worker(base_settings(redis.url, crawl, "auto", items, SYNTH_SEED=True), tmp_path / "w.log")
        try:
            wait_for(lambda: error_lines(w.log()) or not w.alive(), timeout=60, what="the ERROR line")
            stopped = time.monotonic()
            w.proc.terminate()
            assert w.wait(30) == 0, w.log()
            assert time.monotonic() - stopped < 10
        finally:
            w.close()
        assert not redis.admin.exists(CrawlKeys(crawl).meta)
    assert "Traceback" not in w.log() and read_items(items) == []


@pytest.mark.scrapy_matrix
def test_a_start_that_fails_after_the_wait_fails_with_one_line(crawl: str, tmp_path: Path) -> None:
    """A setting at odds with the crawl, found only once Redis takes writes again, ends the start with one CRITICAL line and exit 1, as at once."""
    items = tmp_path / "items.jsonl"
    with refusing("OOM") as redis:
        redis.lift()
        redis.admin.hset(CrawlKeys(crawl).meta, "dedupe", "bf")  # the crawl was started with RedisBloom
        redis.admin.config_set("maxmemory", 1)
        w = Worker(base_settings(redis.url, crawl, "bitmap", items, SYNTH_SEED=True), tmp_path / "w.log")
        try:
            wait_for(lambda: error_lines(w.log()) or not w.alive(), timeout=60, what="the ERROR line")
            assert w.alive(), w.log()
            redis.lift()
            assert w.wait(60) == 1, w.log()
        finally:
            w.close()
    criticals = start_errors(w.log_path.read_text(errors="replace"))
    assert len(criticals) == 1 and "was started with dedupe back-end 'bf', but STREAMS_DEDUPE='bitmap'" in criticals[0]
    assert read_items(items) == []


# -- the daemons -------------------------------------------------------------------------


def test_reclaimer_started_at_maxmemory_says_so_once_then_passes(tmp_path: Path) -> None:
    """The reclaimer started at maxmemory logs one redis_refused ERROR naming maxmemory, retries, and once lifted records its passes (`--check` exits 0)."""
    with refusing("OOM") as redis:
        args = ["--redis-url", redis.url, "--interval", "0.2", "--name", "oomtest"]
        d = Daemon("reclaimer", args, tmp_path / "r.log")
        try:
            refused = d.wait_event("redis_refused", timeout=60)
            before = redis.refusals()
            wait_for(lambda: redis.refusals() >= before + 2, timeout=30, what="two more refused passes")
            assert len(d.named("redis_refused")) == 1 and refused[0]["level"] == "error"
            assert all(word in refused[0]["hint"] for word in NAMED["OOM"]), refused[0]
            assert check("oomtest", redis.url).returncode == EXIT_ERROR  # no pass recorded yet
            redis.lift()
            d.wait_event("redis_accepts_writes_again", timeout=30)
            done = wait_for(lambda: (c := check("oomtest", redis.url)).returncode == 0 and c, timeout=30,
                            what="--check to pass")
            assert '"crawls": 0' in done.stdout
            assert d.terminate() == 0
        finally:
            d.close()
    assert "Traceback" not in d.log() and len(d.named("redis_refused")) == 1


def test_monitor_started_at_maxmemory_says_so_once_and_reads_on(tmp_path: Path) -> None:
    """The monitor started at maxmemory logs one redis_refuses_writes ERROR naming maxmemory, reads on meanwhile, and says when writes go through."""
    with refusing("OOM") as redis:
        args = ["--redis-url", redis.url, "--interval", "0.2", "--metrics-port", str(free_port())]
        d = Daemon("monitor", args, tmp_path / "m.log")
        try:
            said = d.wait_event("redis_refuses_writes", timeout=60)
            passes = len(d.named("pass"))
            d.wait_event("pass", count=passes + 3, timeout=30)  # it reads on, and says it once
            assert len(d.named("redis_refuses_writes")) == 1 and said[0]["level"] == "error"
            assert said[0]["reason"] == "OOM" and all(word in said[0]["hint"] for word in NAMED["OOM"])
            redis.lift()
            d.wait_event("redis_accepts_writes_again", timeout=30)
            passes = len(d.named("pass"))
            d.wait_event("pass", count=passes + 2, timeout=30)
            assert d.terminate() == 0
        finally:
            d.close()
    assert "Traceback" not in d.log() and len(d.named("redis_refuses_writes")) == 1
    assert not [e for e in d.events() if e.get("level") == "error" and e.get("event") != "redis_refuses_writes"]


def check(name: str, url: str) -> subprocess.CompletedProcess[str]:
    """`streams-reclaimer --check` of the reclaimer ``name``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "reclaimer", "--redis-url", url, "--name", name, "--check"],
                          capture_output=True, text=True, timeout=60, env=env)


# -- the CLI -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cli_push_while_redis_refuses_writes_fails_with_one_line(kind: str, crawl: str) -> None:
    """`streams-sched push` on a Redis that refuses writes prints one error line naming the setting and the fix, exits 1, and shows no traceback."""
    with refusing(kind) as redis:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("REDIS_URL", None)
        done = subprocess.run(
            [sys.executable, "-m", "streams_sched.cli", "push", "--redis-url", redis.url, "-c", crawl, "https://a.test/"],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert not redis.admin.exists(CrawlKeys(crawl).meta)
    lines = done.stderr.splitlines()
    assert done.returncode == EXIT_ERROR, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: Redis refused: "), done.stderr
    assert all(word in lines[0] for word in NAMED[kind]), lines[0]
    if kind == "READONLY":
        assert "--redis-url (REDIS_URL) names a read-only replica" in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
