"""The README's Guarantees, Faults and Security claims that need a test of their own, each
checked as written, through a real Scrapy engine or a real `scrapy crawl` where it says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_tools import make_tls_files

from streams_sched import acl
from streams_sched.connection import connect, connect_ready
from streams_sched.errors import RedisUnavailable
from streams_sched.testing import RedisServer, TlsFiles

from helpers import missing, scrapy_crawl, scrapy_project, with_user

START_ERROR = "CRITICAL: streams-sched cannot start:"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scrapy_project(tmp_path_factory.mktemp("project"))


def start_errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if START_ERROR in line]


# -- TLS -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, TlsFiles]]:
    """A TLS-only redis-server on 127.0.0.1 whose certificate (from a CA we trust) names
    another host only."""
    files = make_tls_files(str(tmp_path_factory.mktemp("tls-other-host")), server_names=("redis.elsewhere.test",))
    server = RedisServer(tls=files, tls_auth_clients="no")
    try:
        server.start()
    except RuntimeError as exc:
        missing(f"this redis-server has no TLS support (Debian's redis-server has it): {exc}")
    try:
        yield server, files
    finally:
        server.cleanup()


def test_tls_host_name_is_verified(tls_elsewhere: tuple[RedisServer, TlsFiles]) -> None:
    """A certificate signed by the trusted CA but issued to another host name is refused at once."""
    server, files = tls_elsewhere
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={files.ca}"
    with pytest.raises(RedisUnavailable, match="TLS certificate verification failed") as info:
        connect_ready(url, 30)
    assert "not valid for '127.0.0.1'" in str(info.value)  # the name, not the chain, failed
    # the same server and CA with verification of the name turned off: the chain itself is fine
    assert connect_ready(url + "&ssl_check_hostname=false", 5).ping()


def test_scrapy_crawl_exits_1_on_an_untrusted_certificate(project: Path, tmp_path: Path) -> None:
    """`scrapy crawl` against a TLS server whose certificate does not verify exits 1 with one
    CRITICAL line, without waiting out STREAMS_CONNECT_TIMEOUT_SECONDS."""
    files = make_tls_files(str(tmp_path / "server-ca"))
    other = make_tls_files(str(tmp_path / "other-ca"))
    server = RedisServer(tls=files, tls_auth_clients="no")
    try:
        server.start()
    except RuntimeError as exc:
        missing(f"this redis-server has no TLS support (Debian's redis-server has it): {exc}")
    try:
        url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={other.ca}"
        done = scrapy_crawl(project, {"REDIS_URL": url, "STREAMS_CONNECT_TIMEOUT_SECONDS": 600}, timeout=120)
    finally:
        server.cleanup()
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    errors = start_errors(output)
    assert len(errors) == 1 and "TLS certificate verification failed" in errors[0], output[-3000:]
    assert "is not answering" not in output  # refused at once, not retried


# -- ACL -----------------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="README claim not true yet (reported to the lead): nothing checks the ACL rights at start."
    " Without +xautoclaim the crawl runs and exits 0; without +publish it exits 1 with tracebacks and"
    " no CRITICAL line; without +evalsha or +xreadgroup the I/O thread logs the NOPERM error in a"
    " tight loop and the worker never exits (those two are left out here: they would hang to the timeout)",
)
@pytest.mark.parametrize("right", ["xautoclaim", "publish"])
def test_missing_acl_right_fails_at_once_at_start(project: Path, right: str) -> None:
    """A worker whose ACL user lacks one command of its role (even one it would only use
    later, like XAUTOCLAIM) fails at start: exit 1, one CRITICAL line naming the command."""
    with RedisServer() as server:
        admin = connect(server.url)
        acl.setuser(admin, "worker", "w-secret", "worker", "synth")
        admin.execute_command("ACL SETUSER", "worker", f"-{right}")
        done = scrapy_crawl(
            project,
            {"REDIS_URL": with_user(server.url, "worker", "w-secret"), "STREAMS_PREFIX": "synth",
             "STREAMS_CONNECT_TIMEOUT_SECONDS": 600, "SYNTH_SEED": True, "SYNTH_SITES": 1, "SYNTH_PAGES": 5},
            timeout=60,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    errors = start_errors(output)
    assert len(errors) == 1 and "ACL user may not run" in errors[0] and right in errors[0].lower(), output[-3000:]
    assert "w-secret" not in output



