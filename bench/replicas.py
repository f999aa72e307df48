"""``python -m bench replicas``: what holding acks until a replica has the follow-ups costs.

Where the primary has a replica, a worker sends the acks of a cycle only after
a WAIT (streams_sched/connect/replicas.py). This bench crawls the synthetic web with
one worker on two set-ups that have replicas:

- ``replica``: one primary with one replica (as under Sentinel);
- ``cluster``: a 3-master Redis Cluster with one replica per master;

each time with today's streams-sched and with streams-sched as it was at
``--rev`` (``streams-sched@REV``, bench/revision.py), runs interleaved, and
prints pages/s and Redis CPU per page (summed over the primaries) as medians
and as ratios within the run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .crawl import CrawlSpec, run_crawl

RESULTS = Path(__file__).resolve().parent / "results"
TOPOLOGIES = ("replica", "cluster")


def say(text: str) -> None:
    print(f"[bench replicas] {text}", file=sys.stderr, flush=True)


@contextmanager
def topology(name: str) -> Iterator[str]:
    """Start the servers of one set-up; yield the REDIS_URL the workers use."""
    from streams_sched.testing import RedisServer
    from tests.redis_tools import LocalCluster

    if name == "cluster":
        with LocalCluster(3, replicas=1, bloom=True) as cluster:
            yield cluster.url
        return
    with RedisServer(bloom=True) as primary:
        replica = RedisServer(bloom=True, extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
        try:
            import redis

            client = redis.Redis(port=primary.port)
            deadline = time.monotonic() + 30
            # attached is not enough: "online" once the first sync is done
            while client.info("replication").get("slave0", {}).get("state") != "online":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not attach within 30 s")
                time.sleep(0.05)
            yield primary.url
        finally:
            replica.cleanup()


def run(args: argparse.Namespace) -> dict[str, Any]:
    kinds = ["streams-sched", f"streams-sched@{args.rev}"]
    res: dict[str, Any] = {
        "command": "./scripts/bench.sh replicas " + " ".join(shlex.quote(a) for a in args.argv),
        "sites": args.sites, "pages": args.pages, "repeat": args.repeat, "rev": args.rev,
    }
    for name in args.topologies:
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        with topology(name) as url:
            for i in range(args.repeat):
                for kind in kinds:
                    r = run_crawl(CrawlSpec(kind, 1, args.sites, args.pages), url, f"rep{name}{i}")
                    runs[kind].append(r)
                    say(f"{name}: {kind} run {i + 1}/{args.repeat}: {r['pages_per_s']:.0f} pages/s,"
                        f" Redis {1000 * r['redis_cpu_ms_per_page']:.0f} µs/page, missing {r['missing']}")
        today, before = runs[kinds[0]], runs[kinds[1]]
        res[name] = {
            kind: {
                "pages_per_s": statistics.median(r["pages_per_s"] for r in rs),
                "redis_us_per_page": statistics.median(1000 * r["redis_cpu_ms_per_page"] for r in rs),
                "redis_calls_per_page": statistics.median(r["redis_calls_per_page"] for r in rs),
                "wait_calls_per_page": statistics.median(r["redis_calls"].get("wait", 0) / r["pages"] for r in rs),
                "missing": sum(r["missing"] for r in rs),
            }
            for kind, rs in runs.items()
        }
        # each run against the run of the earlier revision just after it
        res[name]["paired_pages_per_s"] = statistics.median(
            a["pages_per_s"] / b["pages_per_s"] for a, b in zip(today, before, strict=True)
        )
        res[name]["paired_redis_cpu"] = statistics.median(
            a["redis_cpu_ms_per_page"] / b["redis_cpu_ms_per_page"] for a, b in zip(today, before, strict=True)
        )
    return res


def render(res: dict[str, Any]) -> str:
    rev = res["rev"]
    lines = [
        f"# Replica wait: today against streams-sched@{rev}",
        "",
        f"`{res['command']}`: one worker, {res['sites']} sites x {res['pages']} pages, {res['repeat']} interleaved runs each.",
        "",
        "| set-up | code | pages/s | Redis µs/page | Redis commands/page | WAIT/page | missing |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in TOPOLOGIES:
        if name not in res:
            continue
        for kind, m in res[name].items():
            if not isinstance(m, dict):
                continue
            lines.append(
                f"| {name} | {kind} | {m['pages_per_s']:.0f} | {m['redis_us_per_page']:.0f} |"
                f" {m['redis_calls_per_page']:.1f} | {m['wait_calls_per_page']:.3f} | {m['missing']} |"
            )
    lines.append("")
    for name in TOPOLOGIES:
        if name in res:
            lines.append(
                f"- {name}: pages/s {res[name]['paired_pages_per_s']:.2f}x, Redis CPU per page"
                f" {res[name]['paired_redis_cpu']:.2f}x of streams-sched@{rev} (median of paired runs)"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench replicas", description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="80b0c66", help="the revision to compare with (default: the last one without the replica wait)")
    p.add_argument("--sites", type=int, default=10)
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--topologies", default=",".join(TOPOLOGIES))
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.argv = argv
    args.topologies = [t for t in args.topologies.split(",") if t]
    unknown = set(args.topologies) - set(TOPOLOGIES)
    if unknown:
        p.error(f"unknown topologies {sorted(unknown)}; expected some of {list(TOPOLOGIES)}")
    res = run(args)
    text = render(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"replicas-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"replicas-{stamp}.md").write_text(text)
    return 0
