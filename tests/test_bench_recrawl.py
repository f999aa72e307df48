"""bench recrawl: the freshness, waste and rate numbers, the simulation, and a tiny run of the three schedules."""

from __future__ import annotations

import bisect
import importlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest

from streams_sched.testing import redis_server_binary

ROOT = Path(__file__).resolve().parent.parent


def recrawl() -> ModuleType:
    """bench/recrawl.py (bench is not an installed package: it runs from the repository)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.recrawl")


def hand_web(run_s: float) -> object:
    """One site of three pages: page 0 never changes, page 1 (mean 10 s) changes at 5, 30
    and 95, page 2 (mean 50 s) at 20."""
    web = recrawl().Web(1, 3, run_s)
    web.mean_s[:] = [None, 10.0, 50.0]
    web.changes[:] = [[], [5.0, 30.0, 95.0], [20.0]]
    return web


def test_score_counts_changes_seen_within_their_interval_waste_and_the_fullest_window() -> None:
    """On a hand-built schedule: a change counts when its window ends in the run, is in time with a fetch in [t, t + T], a repeat version is waste, and the rate check takes the fullest window."""
    rc = recrawl()
    web = hand_web(100.0)
    fetches = [rc.Fetch(0, p, t, web.version(0, p, t))
               for p, t in ((0, 0.0), (1, 0.0), (2, 0.0), (1, 12.0), (1, 45.0), (0, 50.0), (2, 60.0))]
    s = rc.score(web, fetches, rate=0.1, burst=1.0, window_s=10.0)
    # counted: page 1's changes at 5 and 30 (95 + 10 > 100), page 2's at 20
    assert s["changes"] == 3
    # in time: 5 (fetched at 12) and 20 (fetched at 60); 30 was fetched at 45, after 40
    assert s["in_time"] == 2 and s["freshness"] == pytest.approx(2 / 3)
    # waste: page 0's second fetch got version 0 again
    assert (s["fetches"], s["wasted"]) == (7, 1)
    assert s["by_class"]["never"] == {"fetches": 2, "wasted": 1, "changes": 0, "in_time": 0}
    # three fetches at 0 in one 10 s window, against 0.1 * 10 + 1 = 2
    assert (s["max_in_window"], s["window_limit"], s["sites_over_rate"]) == (3, 2.0, 1)
    assert rc.max_in_window([0.0, 5.0, 10.0, 15.0, 20.0], 10.0) == 2  # [x, x + 10) holds two of them


def test_simulation_paces_sites_and_revisits_on_the_products_schedule() -> None:
    """The model: cron fetches every page once per period 1/rate apart; a fixed interval without jitter comes back exactly every interval; adaptive shortens a changing page's interval and lengthens a still one's."""
    rc = recrawl()
    web = hand_web(1300.0)
    cron = rc.simulate(web, "cron", rate=2.0, burst=2.0)
    assert [(f.page, f.t) for f in cron] == [(0, 0.0), (1, 0.5), (2, 1.0), (0, 600.0), (1, 600.5), (2, 601.0),
                                           (0, 1200.0), (1, 1200.5), (2, 1201.0)]
    fixed = rc.simulate(web, "fixed", rate=10.0, burst=10.0, fixed_every_s=300.0, jitter=0.0)
    assert sorted((f.page, f.t) for f in fixed) == [(p, t) for p in range(3) for t in (0.0, 300.0, 600.0, 900.0, 1200.0)]
    web.changes[1] = [float(t) for t in range(1, 1300, 2)]  # page 1 changes at every visit
    a = rc.Adaptive(every_s=100.0, min_s=10.0, max_s=1000.0, changed=0.5, unchanged=2.0)
    times = defaultdict(list)
    for f in rc.simulate(web, "adaptive", rate=10.0, burst=10.0, adaptive=a, jitter=0.0):
        times[f.page].append(f.t)
    assert times[0] == [0.0, 100.0, 300.0, 700.0]  # 100, then 200, 400: no change
    assert times[1][:5] == [0.0, 100.0, 150.0, 175.0, 187.5]  # 100, then 50, 25, 12.5
    assert all(b - a >= 10.0 for a, b in zip(times[1][4:], times[1][5:]))  # never under min


def test_time_averaged_freshness_and_the_optimum_for_the_same_fetches() -> None:
    """A page is fresh from each fetch until its next change; the optimum of one site of a 10 s page and a static one at 0.05 fetches/s is Cho & Garcia-Molina's."""
    rc = recrawl()
    assert rc.fresh_time([5.0, 30.0], [0.0, 12.0, 40.0], 0.0, 50.0) == pytest.approx(5.0 + 18.0 + 10.0)
    assert rc.fresh_time([], [10.0], 0.0, 50.0) == pytest.approx(40.0)
    from streams_sched.worker import freshness as fr

    # all of the budget on the changing page: its freshness at f = 0.05, the static page's 1
    assert rc.optimal_freshness([0.1, 0.0], 0.05) == pytest.approx((fr.freshness(0.1, 0.05) + 1.0) / 2)
    assert rc.optimal_freshness([0.1, 0.0], 0.0) == 0.5


def test_the_freshness_schedule_skips_pages_it_cannot_follow_and_spends_on_the_others() -> None:
    """Simulated with the product's rule: a site of 2 s, 8 s, 30 s and static pages at 2 fetches/s reaches 95% of the optimum, and beats uniform visits."""
    rc = recrawl()
    web = rc.Web(4, 40, 600.0, 1, rc.parse_classes("0.25:2,0.25:8,0.25:30,0.25:never"))
    fresh = rc.score(web, rc.simulate(web, "freshness", 2.0, 2.0, fresh=rc.Fresh(20.0, 1.0, 120.0, 1.0)), 2.0, 2.0,
                     warm_s=120.0)
    uniform = rc.score(web, rc.simulate(web, "fixed", 2.0, 2.0, fixed_every_s=20.0), 2.0, 2.0, warm_s=120.0)
    assert fresh["of_optimum"] >= 0.95 and fresh["time_freshness"] > uniform["time_freshness"]
    assert fresh["by_class"]["never"]["fetches"] < uniform["by_class"]["never"]["fetches"] / 2


def test_dated_pages_let_the_freshness_rule_see_half_again_crons_changes_in_the_first_30_minutes() -> None:
    """Pages dated before the run (a changing page's age exponential, a static one's 1-365 days): with Last-Modified the model's freshness rule sees >= 1.5x cron's changes in time within its fetches and >= 95% of the optimum; without, it does not."""
    rc = recrawl()
    web = rc.Web(20, 100, 1800.0, 1, rc.CLASSES, 0.5, 0, 1.0)
    assert all(web.modified_s(0, p, 0) < 0 for p in range(100))
    static = [web.modified_s(0, p, 0) for p in range(100) if web.mean_s[p] is None]
    assert all(-365 * 86400.0 <= t <= -86400.0 for t in static)
    cron = rc.score(web, rc.simulate(web, "cron", 2.0, 2.0), 2.0, 2.0)
    spec = rc.Fresh(600.0, 10.0, 3600.0, 0.055)
    dated = rc.score(web, rc.simulate(web, "freshness", 2.0, 2.0, fresh=spec), 2.0, 2.0)
    assert dated["fetches"] <= cron["fetches"] and dated["in_time"] >= 1.5 * cron["in_time"]
    assert dated["of_optimum"] >= 0.95
    undated_web = rc.Web(20, 100, 1800.0, 1, rc.CLASSES, 0.0, 0, 0.0)
    undated = rc.score(undated_web, rc.simulate(undated_web, "freshness", 2.0, 2.0, fresh=spec), 2.0, 2.0)
    assert undated["in_time"] < 1.5 * cron["in_time"]


@pytest.mark.e2e
def test_tiny_run_reports_three_schedules_whose_numbers_match_the_servers_fetch_log(tmp_path: Path) -> None:
    """`python -m bench recrawl` at 3 sites x 10 pages and time scale 0.0025 prints the three rows and PASS/FAIL lines, and each row's fetches, waste, changes in time and fullest window agree with the server's fetch log."""
    if redis_server_binary() is None:
        pytest.skip("the bench needs redis-server")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    work = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "recrawl", "--sites", "3", "--pages", "10", "--minutes", "20",
         "--time-scale", "0.0025", "--sim-sites", "3", "--out", str(tmp_path), "--work-dir", str(work)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for kind in ("cron", "fixed", "adaptive", "freshness"):
        # the table, the one by class and the one of the pages with validators
        assert sum(line.startswith(f"| {kind} | ") for line in proc.stdout.splitlines()) == 3, kind
    assert "freshness fetches at most as much as cron" in proc.stdout
    assert "of the optimal freshness for its fetches" in proc.stdout
    assert proc.stdout.count("PASS: ") + proc.stdout.count("FAIL: ") >= 7
    [result] = tmp_path.glob("recrawl-2*.json")
    res = json.loads(result.read_text())
    assert set(res["runs"]) == {"cron", "fixed", "adaptive", "freshness"}
    # cron never asks with validators; the freshness rule's revisits of unchanged pages get 304s
    assert res["runs"]["cron"]["run"]["etag"]["not_modified"] == 0
    fresh = res["runs"]["freshness"]
    assert fresh["run"]["etag"]["not_modified"] > 0 and fresh["run"]["etag"]["ratio"] > 5
    assert 0 < fresh["score"]["time_freshness"] <= 1 and fresh["score"]["optimum"] > 0
    web = recrawl().Web(3, 10, 20 * 60.0, seed=1)
    for kind, run in res["runs"].items():
        log = [tuple(f) for f in json.loads((work / f"{kind}-fetches.json").read_text())]
        log = [f for f in log if 0 <= f[2] <= web.run_s]
        by_page: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)
        for site, page, t, version in log:
            assert version == web.version(site, page, t)  # the server served the clock's version
            by_page[(site, page)].append((t, version))
        wasted = sum(1 for got in by_page.values() for a, b in zip(sorted(got), sorted(got)[1:]) if a[1] == b[1])
        counted = seen = 0
        for (site, page), mean in ((k, web.mean_s[k[0] * 10 + k[1]]) for k in ((s, p) for s in range(3) for p in range(10))):
            times = sorted(t for t, _ in by_page.get((site, page), ()))
            for t in web.changes[site * 10 + page] if mean else ():
                if t + mean <= web.run_s:
                    counted += 1
                    j = bisect.bisect_left(times, t)
                    seen += j < len(times) and times[j] <= t + mean
        windows = []
        for site in range(3):
            ts = sorted(f[2] for f in log if f[0] == site)
            windows.append(max((bisect.bisect_left(ts, t + 10.0) - i for i, t in enumerate(ts)), default=0))
        s = run["score"]
        assert (s["fetches"], s["wasted"], s["changes"], s["in_time"]) == (len(log), wasted, counted, seen), kind
        assert s["max_in_window"] == max(windows), kind
        assert s["pages_seen"] == 30, kind  # every page found from its home page
