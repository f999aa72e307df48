"""bench sites --rounds: the kinds alternate their order between rounds, and the tables take each kind's median run."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def sites() -> ModuleType:
    """bench/sites.py (bench is not an installed package: it runs from the repository)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.sites")


def _run(kind: str, rnd: int, pps: float, workers: int = 1) -> dict[str, Any]:
    return {
        "kind": kind, "workers": workers, "round": rnd, "pages_per_s": pps, "complete": False,
        "pages_per_s_from_gate": pps, "startup_s": 0.1, "pages": int(pps * 30), "max_rss_mb": [100.0],
        "worker_cpu_ms_per_page": 1000 / pps, "worker_gc_ms_per_page": 0.01, "gc_collections": [1, 0, 0],
        "repeats": 0, "redis_cpu_us_per_page": 80.0, "redis_calls_per_page": 18.7,
    }


def test_rounds_alternate_the_order_of_the_kinds() -> None:
    """No kind runs first in every round: odd rounds keep the order, even ones reverse it."""
    kinds = ["memory", "streams-sched@HEAD", "streams-sched"]
    assert [sites().round_order(kinds, r)[0] for r in (1, 2, 3)] == ["memory", "streams-sched", "memory"]


def test_the_tables_give_the_median_run_of_each_kind_and_every_round() -> None:
    """With three rounds the ratio is between the kinds' median runs, and the rounds table lists every run in order."""
    runs = [_run("memory", 1, 1000), _run("streams-sched", 1, 700), _run("streams-sched", 2, 950),
            _run("memory", 2, 1500), _run("memory", 3, 1200), _run("streams-sched", 3, 1100)]
    push = {"urls_per_s": 60000.0, "net_urls_per_s": 62000.0, "startup_s": 0.5, "bytes_per_site": 389.0}
    res = {
        "config": {"command": "./scripts/bench.sh sites --rounds 3", "window_s": 30, "concurrency": 256,
                   "per_domain": 2, "kinds": ["memory", "streams-sched"], "rounds": 3, "deep": (10, 2000)},
        "load": "0.1 0.1 0.1", "machine": {"cores": 2},
        "rows": [{"sites": 1000, "runs": runs, "push": {"streams-sched": [push] * 3},
                  "seeder": {"streams-sched": {"urls_per_s": 50000.0}},
                  "seeder_calls": {"streams-sched": [{"urls_per_s": 50000.0}] * 3}}],
    }
    text = sites().render(res)
    # medians: memory 1,200 (of 1,000 / 1,500 / 1,200), streams-sched 950 (of 700 / 950 / 1,100)
    assert "| 1,000 | 1,200 | 950 | 0.79x |" in text
    assert "| 1,000 | streams-sched | 1 | 700 / 950 / 1,100 | 950 | 0.79x |" in text
    assert "| 1,000 | memory | 1 | 1,000 / 1,500 / 1,200 | 1,200 | 1.00x |" in text
    assert "streams-sched (round 2)" in text
