"""A worker that cannot start says why in one line, through a real `scrapy crawl`, and exits 1."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from streams_sched.testing import RedisServer, free_port

from helpers import scrapy_crawl, scrapy_project, start_errors

pytestmark = [pytest.mark.scrapy_matrix, pytest.mark.e2e]  # each test runs `scrapy crawl` or a redis-server

@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scrapy_project(tmp_path_factory.mktemp("project"))


def first_error(output: str) -> str:
    return next(line for line in output.splitlines() if "] ERROR:" in line or "] CRITICAL:" in line)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"STREAMS_LEASE_SECONDS": -5}, "STREAMS_LEASE_SECONDS=-5"),
        ({"STREAMS_BAND_RATIO": {"high": 5, "urgent": 1}}, "unknown band(s) ['urgent']"),
        ({"STREAMS_SITES": {"a.test": {"rate": "fast"}}}, "STREAMS_SITES['a.test']['rate']='fast'"),
        ({"STREAMS_SITES": '{"a.test": {"rate": 2}'}, "STREAMS_SITES='{\"a.test\": {\"rate\": 2}'"),
        ({"REDIS_URL": "redis://w:s3cret@localhost:63a9/0"}, "REDIS_URL='redis://w:***@localhost"),
        ({"REDIS_URL": "http://localhost:6379"}, "REDIS_URL='http://localhost:6379'"),
    ],
    ids=["negative-lease", "unknown-band", "site-policy", "site-json", "url-port", "url-scheme"],
)
def test_invalid_setting_fails_scrapy_crawl_with_one_clear_line(project: Path, settings: dict, named: str) -> None:
    """An invalid setting makes `scrapy crawl` exit 1 with one CRITICAL line naming the setting and value."""
    done = scrapy_crawl(project, {"REDIS_URL": "redis://127.0.0.1:1/0", **settings})
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    errors = start_errors(output)
    assert len(errors) == 1 and named in errors[0], output[-3000:]
    assert "s3cret" not in output
    assert first_error(output) == errors[0]  # Scrapy's tracebacks come after it


def test_unreachable_redis_fails_after_the_connect_timeout(project: Path) -> None:
    """With no Redis at REDIS_URL the worker retries for STREAMS_CONNECT_TIMEOUT_SECONDS, then one line, exit 1."""
    port = free_port()
    started = time.monotonic()
    done = scrapy_crawl(project, {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "STREAMS_CONNECT_TIMEOUT_SECONDS": 2})
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    errors = start_errors(output)
    assert len(errors) == 1 and f"127.0.0.1:{port}/0 did not answer within 2s" in errors[0], output[-3000:]
    assert first_error(output) == errors[0]
    assert output.count("is not answering") == 1  # one warning, not one per retry
    assert elapsed >= 2


def test_wrong_password_fails_at_once(project: Path) -> None:
    """Wrong credentials are not retried until the timeout: the worker says so at once."""
    with RedisServer(extra_args=["--requirepass", "right"]) as server:
        url = f"redis://:wrong@127.0.0.1:{server.port}/0"
        started = time.monotonic()
        done = scrapy_crawl(project, {"REDIS_URL": url, "STREAMS_CONNECT_TIMEOUT_SECONDS": 60})
    output = done.stdout + done.stderr
    assert done.returncode == 1 and time.monotonic() - started < 30, output
    errors = start_errors(output)
    assert len(errors) == 1 and "refused the credentials" in errors[0], output[-3000:]
    assert "wrong" not in errors[0]
