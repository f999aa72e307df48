"""``python -m bench recrawl-scale`` at a tiny size: both frontiers crawl, and the figures add up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams_sched.testing import redis_server_binary

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.e2e  # runs `python -m bench recrawl-scale`, its redis-servers and workers


def test_recrawl_scale_quick_mode_reports_both_frontiers(tmp_path: Path) -> None:
    """`python -m bench recrawl-scale --quick` builds tracked pages the listing recognises, crawls both frontiers and reports CPU per fetch and their ratios."""
    if redis_server_binary() is None:
        if os.environ.get("CI"):
            pytest.fail("the benchmark needs redis-server")
        pytest.skip("the benchmark needs redis-server")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "recrawl-scale", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "### Tracked pages at scale: 1,000 tracked pages on 20 sites" in proc.stdout
    [result] = tmp_path.glob("recrawl-scale-*.json")
    res = json.loads(result.read_text())
    # every page of s0.test is listed by `streams-sched revisits` as a tracked page
    assert res["build"]["listed_s0"] == 50 and res["build"]["waiting_per_site"] == 50
    runs = {r["kind"]: r for r in res["runs"]}
    assert set(runs) == {"tracked", "one-off"}
    for r in runs.values():
        assert r["fetched"] >= 60 and r["repeats"] == 0, r
        # Redis's CPU counters tick in milliseconds: a quick run's may not move
        assert r["worker_cpu_us_per_fetch"] > 0 and r["redis_cpu_us_per_fetch"] >= 0, r
        # a quick run's worker may have leased all it fetches before the start gate opened,
        # and its acks may leave in the close: its round trips in the window can be 0
        assert r["round_trips_per_fetch"] >= 0, r
    tracked = runs["tracked"]
    # only due pages moved (5 a site are due), and every fetch put its page back for its next visit
    assert tracked["fetched"] <= tracked["promoted"] <= 5 * 20, tracked
    assert tracked["rescheduled"] == tracked["fetched"], tracked
    assert len(res["ratios"]["worker_cpu_us_per_fetch"]) == 1 and res["ratios"]["worker_cpu_us_per_fetch"][0] > 0
    for what in ("redis_cpu_us_per_fetch", "round_trips_per_fetch"):
        assert len(res["ratios"][what]) == 1
