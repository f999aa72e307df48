"""A Redis set up the way managed services run theirs: TLS, CONFIG renamed away, no modules, an ACL user per role."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from redis_tools import make_tls_files

from streams_sched.admin import acl
from streams_sched.cli import main as cli_main
from streams_sched.connect.clients import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.testing import RedisServer, TlsFiles, free_port

from daemons import Daemon, try_scrape, value
from helpers import ROOT, Worker, base_settings, crawl_to_end, crawled_urls, wait_for, with_user

#: what managed services do to CONFIG (ElastiCache, Memorystore, Azure Cache: renamed or blocked)
MANAGED_ARGS = ["--rename-command", "CONFIG", ""]


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA generated for this test run, with a server certificate."""
    return make_tls_files(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture
def managed(tls_files: TlsFiles) -> Iterator[RedisServer]:
    """TLS only (server certificate; clients bring none, as with most managed services), CONFIG renamed away, no modules."""
    server = RedisServer(tls=tls_files, tls_auth_clients="no", extra_args=MANAGED_ARGS)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def _url(server: RedisServer, files: TlsFiles, user: str) -> str:
    return with_user(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={files.ca}", user, f"{user}-secret")


@pytest.mark.e2e
def test_worker_daemons_and_cli_run_on_a_managed_style_redis(managed: RedisServer, tls_files: TlsFiles, crawl: str, tmp_path: Path) -> None:
    """With CONFIG gone, no modules, TLS and one ACL user per role: a worker crawls every page (bitmap dedupe, said once), the reclaimer and the monitor pass and answer --check, and status answers."""
    admin = connect(f"rediss://127.0.0.1:{managed.port}/0?ssl_ca_certs={tls_files.ca}")
    with pytest.raises(Exception, match="unknown command"):
        admin.execute_command("CONFIG", "GET", "maxmemory-policy")
    for role in ("worker", "reclaimer", "monitor"):
        acl.setuser(admin, role, f"{role}-secret", role, crawl if role == "worker" else None)
    admin.execute_command("ACL LOG", "RESET")

    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(_url(managed, tls_files, "worker"), crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=3, SYNTH_PAGES=40), tmp_path / "w.log")
    crawl_to_end(w)
    assert set(crawled_urls(items)) == SyntheticWeb(sites=3, pages=40).all_urls()
    log = w.log()
    assert log.count("dedupe=bitmap") == 1 and "Traceback" not in log, log[-3000:]

    reclaimer_url = _url(managed, tls_files, "reclaimer")
    r = Daemon("reclaimer", ["--redis-url", reclaimer_url, "--interval", "0.2", "--name", "managed"], tmp_path / "r.log")
    port = free_port()
    m = Daemon("monitor", ["--redis-url", _url(managed, tls_files, "monitor"), "--metrics-port", str(port), "--interval", "0.3"], tmp_path / "m.log")
    try:
        r.wait_event("pass", count=2)
        check = subprocess.run(
            [sys.executable, "-m", "reclaimer", "--check", "--redis-url", reclaimer_url, "--name", "managed"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        metrics = wait_for(lambda: try_scrape(port), timeout=20, what="/metrics")
        assert value(metrics, "streams_sched_sites", crawl=crawl, state="active") == 3
        m.wait_event("pass", count=2)
        assert not m.named("redis_refused") and not m.named("read_failed"), m.log()
        assert r.terminate() == 0 and m.terminate() == 0
    finally:
        r.close()
        m.close()

    result = CliRunner().invoke(cli_main, ["status", "-c", crawl], env={"REDIS_URL": _url(managed, tls_files, "monitor")}, catch_exceptions=False)
    assert result.exit_code == 0 and "3 site(s)" in result.output and "finished 120/120" in result.output, result.output
    assert acl.denials(admin) == [], acl.denials(admin)
