"""``python -m bench faults``: the seeded random fault campaign, seed after seed, for a given time.

Each run is one crawl with several faults drawn from its seed (tests/campaign.py, the
engine tests/test_campaign.py runs a few fixed seeds of): nodes SIGKILLed (left down,
restarted with their data or empty) or SIGSTOPped, the node REDIS_URL names first
included, ``maxmemory`` reached at start or mid-crawl, connections cut by a proxy,
workers SIGKILLed, SIGTERMed or joining with a clock off. Seeds run one after another,
alternating the set-ups (a 3+3 Redis Cluster, a primary with two replicas under three
sentinels), until ``--minutes`` have passed; with ``--tracked`` one page in 20 is tracked
(continuous crawling) and each run checks too that every tracked page is in the frontier
exactly once after the crawl. The table counts, per set-up and kind of
fault: how often it was drawn and fired, pages lost and pages crawled twice in the runs
it was in (a repeat counts for the fault that explains it: the SIGKILL of the worker that
had crawled it first, else the last fault on Redis before it), how long the crawl's
rate took to come back, and the seeds that failed. Every failing seed replays with
``STREAMS_CAMPAIGN_SEED=SEED STREAMS_CAMPAIGN_SETUP=SETUP pytest tests/test_campaign.py``;
its worker logs are kept beside the results.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def say(text: str) -> None:
    print(f"[bench faults] {text}", file=sys.stderr, flush=True)


def _campaign() -> Any:
    """tests/campaign.py, imported as the tests import it (tests/ on sys.path)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import campaign

    return campaign


def campaign_track_one_in() -> int:
    return int(_campaign().TRACK_ONE_IN)


def run(args: argparse.Namespace) -> dict[str, Any]:
    campaign = _campaign()
    res: dict[str, Any] = {
        "command": "./scripts/bench.sh faults " + " ".join(shlex.quote(a) for a in args.argv),
        "minutes": args.minutes, "setups": args.setups, "first_seed": args.first_seed, "tracked": args.tracked,
        "crawl": {"sites": campaign.SITES, "pages": campaign.PAGES, "workers": campaign.WORKERS,
                  "concurrent_requests": campaign.CONCURRENT_REQUESTS, **campaign.CRAWL_SETTINGS},
        "machine": {"cores": os.cpu_count(), "load_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg())},
        "runs": [],
    }
    deadline = time.monotonic() + args.minutes * 60
    seed = args.first_seed
    started = time.monotonic()
    while time.monotonic() < deadline:
        for setup in args.setups:
            if time.monotonic() >= deadline:
                break
            work = Path(tempfile.mkdtemp(prefix=f"bench-faults-{setup}-{seed}-"))
            try:
                result = campaign.run_campaign(setup, seed, work, say=say if args.verbose else None, tracked=args.tracked)
                failed = result.failures()
                say(result.summary())
                if failed:
                    say(result.report())
                    kept = args.logs / f"{setup}-{seed}"
                    kept.mkdir(parents=True, exist_ok=True)
                    for log in work.glob("w*.log"):
                        shutil.copy(log, kept / log.name)
                    (kept / "report.txt").write_text(result.report() + "\n")
                res["runs"].append(result.as_dict())
            finally:
                shutil.rmtree(work, ignore_errors=True)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"faults-{args.stamp}.json").write_text(json.dumps(res, indent=1, default=str))
        seed += 1
    res["elapsed_s"] = time.monotonic() - started
    return res


def table(res: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (set-up, fault label): what it cost over the runs it was in."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for run_ in res["runs"]:
        per_label: dict[str, int] = {}
        for fired in run_["fired"]:
            key = (run_["setup"], fired["label"])
            row = rows.setdefault(key, {"drawn": 0, "fired": 0, "runs": set(), "failed": set(), "lost": 0,
                                        "twice": 0, "twice_max": 0, "recover": [], "unrecovered": 0})
            row["drawn"] += 1
            if fired["skipped"]:
                continue
            row["fired"] += 1
            per_label[fired["label"]] = per_label.get(fired["label"], 0) + fired["twice"]
            if fired["recover_s"] is None:
                row["unrecovered"] += 1
            else:
                row["recover"].append(fired["recover_s"])
            if run_["seed"] not in row["runs"]:
                row["runs"].add(run_["seed"])
                row["lost"] += run_["missing"]
                if run_["failures"]:
                    row["failed"].add(run_["seed"])
        for label, twice in per_label.items():
            row = rows[(run_["setup"], label)]
            row["twice"] += twice
            row["twice_max"] = max(row["twice_max"], twice)
    return rows


def render(res: dict[str, Any]) -> str:
    runs = res["runs"]
    crawl = res["crawl"]
    lines = [
        "# Fault campaign",
        "",
        f"`{res['command']}`: {len(runs)} runs in {res.get('elapsed_s', 0) / 60:.1f} minutes, seeds from"
        f" {res['first_seed']}; each a crawl of {crawl['sites']} sites x {crawl['pages']} pages by"
        f" {crawl['workers']} workers (CONCURRENT_REQUESTS {crawl['concurrent_requests']}, lease"
        f" {crawl['STREAMS_LEASE_SECONDS']} s, socket timeout {crawl['STREAMS_SOCKET_TIMEOUT_SECONDS']} s)"
        f" with 3-5 faults"
        + (f", one page in {campaign_track_one_in()} tracked" if res.get("tracked") else "")
        + f". {res['machine']['cores']} cores, load {res['machine']['load_at_start']} at the start.",
        "",
    ]
    for setup in res["setups"]:
        mine = [r for r in runs if r["setup"] == setup]
        if not mine:
            continue
        failed = [r for r in mine if r["failures"]]
        twice = [r["twice"] for r in mine]
        over = [r for r in mine if r["twice"] > r["twice_bound"]]
        off = [r for r in mine if r.get("counters_off")]
        lines += [
            f"## {setup}: {len(mine)} runs, {len(failed)} failed",
            "",
            f"Pages lost: {sum(r['missing'] for r in mine)}. Crawled twice: {sum(twice)} in all, at most"
            f" {max(twice)} in one run; {len(over)} runs over their bound (in flight at each kill or stop plus"
            f" one second of the rate)" + (f": seeds {', '.join(str(r['seed']) for r in over)}" if over else "") + "."
            + (f" Revisits of tracked pages: {sum(r.get('revisits', 0) for r in mine)}; runs with a tracked page"
               f" lost or scheduled twice: {sum(1 for r in mine if r.get('tracked_problems'))}."
               if res.get("tracked") else "")
            + (f" Counters that do not balance with nothing left (enqueued against acked + dead, reported, not"
               f" failed) after seeds {', '.join(str(r['seed']) for r in off)}." if off else ""),
            "",
            "| fault | drawn | fired | runs failed | pages lost in its runs | crawled twice (total, max per run)"
            " | rate back, median (max) | not back | failing seeds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for (row_setup, label), row in sorted(table(res).items()):
            if row_setup != setup:
                continue
            rec = row["recover"]
            back = f"{statistics.median(rec):.1f} s ({max(rec):.1f} s)" if rec else "-"
            seeds = ", ".join(str(s) for s in sorted(row["failed"])) or "-"
            lines.append(
                f"| {label} | {row['drawn']} | {row['fired']} | {len(row['failed'])} | {row['lost']} |"
                f" {row['twice']}, {row['twice_max']} | {back} | {row['unrecovered']} | {seeds} |"
            )
        if failed:
            tracked_env = " STREAMS_CAMPAIGN_TRACKED=1" if res.get("tracked") else ""
            lines += ["", "Failing seeds (replay: `STREAMS_CAMPAIGN_SEED=SEED STREAMS_CAMPAIGN_SETUP="
                      f"{setup}{tracked_env} pytest tests/test_campaign.py`):", ""]
            for r in failed:
                lines.append(f"- {r['seed']}: {'; '.join(r['failures'])[:400]}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="how long to run seeds for (default 30)")
    p.add_argument("--setups", default="cluster,sentinel", help="which set-ups, alternating (default both)")
    p.add_argument("--first-seed", type=int, help="the first seed (default: a random one, printed)")
    p.add_argument("-v", "--verbose", action="store_true", help="log each fault as it fires")
    p.add_argument("--tracked", action="store_true",
                   help="track one page in 20 (continuous crawling) and check each is in the frontier once")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.argv = argv
    args.setups = [s for s in args.setups.split(",") if s]
    setups = _campaign().SETUPS
    unknown = set(args.setups) - set(setups)
    if unknown:
        p.error(f"unknown set-ups {sorted(unknown)}; expected some of {list(setups)}")
    if args.first_seed is None:
        args.first_seed = random.SystemRandom().randrange(1000, 1_000_000)
    args.stamp = time.strftime("%Y%m%d-%H%M%S")
    args.logs = args.out / f"faults-{args.stamp}"
    say(f"seeds from {args.first_seed}, for {args.minutes:g} minutes, on {', '.join(args.setups)}")
    res = run(args)
    text = render(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"faults-{args.stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"faults-{args.stamp}.md").write_text(text)
    say(f"wrote {args.out}/faults-{args.stamp}.{{json,md}}"
        + (f"; the failing runs' worker logs in {args.logs}" if args.logs.exists() else ""))
    return 0
