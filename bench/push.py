"""``python -m bench push``: how fast seeds go in, through ``streams_sched.Seeder`` and ``streams-sched push``.

N distinct sites with one URL each (``http://s{i}.test/``, as in bench/sites.py),
on a throwaway redis-server with RedisBloom (``single``) and on a 3-master
LocalCluster (``cluster``), for each kind (``--kinds``; ``KIND@REV`` runs that
revision's streams_sched, bench/revision.py). Per target and kind, each on an
emptied Redis:

- ``seeder``: ``Seeder.seed()`` on the N URLs in its own process
  (bench/sites_seed.py), timed around the call; then the same N URLs again, all
  duplicates (``seeder again``);
- ``push``: ``streams-sched push --file`` (its own process, like an operator's),
  the wall time of the whole command, and net of its start-up (the same command
  on an empty file).

Every run checks that what it reports is exact: N added (N duplicates for the
second seeding). Reported besides the rate: the seeding process's CPU time per
URL (for push, the command's net of its start-up), Redis CPU per URL (INFO cpu,
summed over the primaries, and of the busiest one) and EVALSHA time per URL
(INFO commandstats). On a machine where the client and the Redis processes
share two cores, the rate is what this machine gives at that moment; the
"own-core bound", 1 / the larger of the client's and the busiest primary's CPU
per URL, is the rate with a core for each of them. On the cluster the crawl's
name is one whose 16 shards spread 6/5/5 over the three primaries.

    python -m bench push                       # 1,000,000 URLs, single and cluster
    python -m bench push --urls 100000 --targets single --kinds streams-sched,streams-sched@main
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .crawl import KINDS
from .onepage import site_url
from .revision import split_kind
from .sites import RESULTS, _dedupe, _python, cli_push, net_rate, net_text, prepare

TARGETS = ("single", "cluster")


def say(text: str) -> None:
    print(f"[bench push] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench push", description=__doc__.splitlines()[0])
    p.add_argument("--urls", type=lambda s: int(float(s)), default=1_000_000, help="URLs, one per site (default 1e6)")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated: single, cluster (default both)")
    p.add_argument("--kinds", default="streams-sched",
                   help="comma-separated streams-sched kinds (default streams-sched); KIND@REV compares revisions")
    p.add_argument("--no-cli", dest="cli", action="store_false", help="only the Seeder, not `streams-sched push`")
    p.add_argument("--repeat", type=int, default=1, help="runs of each measurement, interleaved (default 1)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.targets = a.targets.split(",")
    a.kinds = a.kinds.split(",")
    for t in a.targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r} (one of {', '.join(TARGETS)})")
    for kind in a.kinds:
        if not split_kind(kind)[0].startswith("streams-sched") or split_kind(kind)[0] not in KINDS:
            p.error(f"{kind!r} is not a streams-sched kind")
    return a


def primaries(client: Any) -> list[Any]:
    from streams_sched.connect.clients import is_cluster_client

    if is_cluster_client(client):
        return [n.redis_connection for n in client.get_primaries()]
    return [client]


class RedisMeter:
    """Redis CPU seconds, EVALSHA microseconds and used_memory, summed over the primaries."""

    def __init__(self, client: Any) -> None:
        self.nodes = primaries(client)

    def empty(self) -> None:
        for node in self.nodes:
            node.flushall()
            node.script_flush()

    def read(self) -> dict[str, Any]:
        cpu = usec = calls = mem = 0.0
        per_node = []
        for node in self.nodes:
            info = node.info()
            node_cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
            per_node.append(node_cpu)
            cpu += node_cpu
            mem += float(info["used_memory"])
            stats = node.info("commandstats").get("cmdstat_evalsha", {})
            usec += float(stats.get("usec", 0))
            calls += float(stats.get("calls", 0))
        return {"cpu_s": cpu, "node_cpu_s": per_node, "evalsha_usec": usec, "evalsha_calls": calls, "used_memory": mem}

    def since(self, before: dict[str, Any], n: int) -> dict[str, Any]:
        after = self.read()
        busiest = max(a - b for a, b in zip(after["node_cpu_s"], before["node_cpu_s"], strict=True))
        return {
            "redis_cpu_us_per_url": (after["cpu_s"] - before["cpu_s"]) * 1e6 / n,
            "busiest_node_cpu_us_per_url": busiest * 1e6 / n,
            "evalsha_us_per_url": (after["evalsha_usec"] - before["evalsha_usec"]) / n,
            "evalsha_calls": after["evalsha_calls"] - before["evalsha_calls"],
            "used_memory_bytes": after["used_memory"] - before["used_memory"],
        }


def balanced_crawl(client: Any, prefix: str) -> str:
    """A crawl name whose shards spread over a cluster's primaries as evenly as 16 shards can
    (6, 5, 5 on three): where the shards' hash tags land is chance, and the busiest primary
    bounds the rate. On one Redis, the first name."""
    from streams_sched.connect.clients import is_cluster_client
    from streams_sched.frontier.keys import DEFAULT_SHARDS, ShardKeys

    if not is_cluster_client(client):
        return prefix + "0"
    best, best_load = "", DEFAULT_SHARDS + 1
    for k in range(500):
        name = f"{prefix}{k}"
        counts: dict[str, int] = {}
        for shard in range(DEFAULT_SHARDS):
            node = client.get_node_from_key(ShardKeys(name, shard).tag).name
            counts[node] = counts.get(node, 0) + 1
        load = max(counts.values()) if len(counts) == len(primaries(client)) else DEFAULT_SHARDS
        if load < best_load:
            best, best_load = name, load
        if best_load <= -(-DEFAULT_SHARDS // len(primaries(client))):
            break
    return best


def seeder_runs(kind: str, meter: RedisMeter, url: str, crawl: str, urls: Path, n: int) -> list[dict[str, Any]]:
    """Seed the N URLs on an emptied Redis, then seed them again (all duplicates)."""
    meter.empty()
    out = []
    for label, want in (("seeder", "added"), ("seeder again", "duplicates")):
        before = meter.read()
        r = json.loads(_python(kind, ["bench.sites_seed", "api", url, crawl, _dedupe(kind), str(urls)], "Seeder"))
        if r[want] != n:
            raise RuntimeError(f"{label} ({kind}): {r[want]} {want} of {n} URLs ({r})")
        out.append({"how": label, "urls": n, "seconds": r["seed_s"], "urls_per_s": n / max(r["seed_s"], 1e-9),
                    "client_cpu_us_per_url": r.get("seed_cpu_s", float("nan")) * 1e6 / n, **meter.since(before, n)})
    return out


def cli_run(kind: str, meter: RedisMeter, url: str, crawl: str, urls: Path, nothing: Path, n: int) -> dict[str, Any]:
    """``streams-sched push --file`` of the N URLs on an emptied Redis: the whole command, and net of start-up."""
    meter.empty()
    prepare(kind, url, crawl)
    children = _children_cpu()
    _, startup = cli_push(kind, url, crawl, nothing)
    before, startup_cpu = meter.read(), _children_cpu()
    added, wall = cli_push(kind, url, crawl, urls)
    cpu = _children_cpu() - startup_cpu - (startup_cpu - children)  # net of the start-up's CPU
    if added != n:
        raise RuntimeError(f"streams-sched push ({kind}) added {added} of {n} URLs")
    return {"how": "push", "urls": n, "seconds": wall, "startup_s": startup, "urls_per_s": n / wall,
            "net_urls_per_s": net_rate(n, wall, startup), "client_cpu_us_per_url": cpu * 1e6 / n,
            **meter.since(before, n)}


def _children_cpu() -> float:
    """CPU seconds of this process's finished children (the push commands)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_target(target: str, args: argparse.Namespace, urls: Path, nothing: Path) -> list[dict[str, Any]]:
    from streams_sched.connect.clients import connect
    from streams_sched.testing import RedisServer, find_redisbloom
    from tests.redis_tools import LocalCluster

    bloom = find_redisbloom() is not None
    server: Any = RedisServer(bloom=bloom) if target == "single" else LocalCluster(3, bloom=bloom)
    rows = []
    with server:
        client = connect(server.url)
        meter = RedisMeter(client)
        for n, (i, kind) in enumerate((i, kind) for _ in range(args.repeat) for i, kind in enumerate(args.kinds)):
            crawl = balanced_crawl(client, f"benchpush{i}-{n}-")
            runs = seeder_runs(kind, meter, server.url, crawl, urls, args.urls)
            if args.cli:
                runs.append(cli_run(kind, meter, server.url, crawl, urls, nothing, args.urls))
            for r in runs:
                r.update(target=target, kind=kind, load=" ".join(f"{x:.2f}" for x in os.getloadavg()))
                say(f"{target} {kind} {r['how']}: {r['urls_per_s']:,.0f} URLs/s"
                    + (f" ({net_text(r['net_urls_per_s'])} net of {r['startup_s']:.1f} s start-up)" if "startup_s" in r else "")
                    + f", Redis {r['redis_cpu_us_per_url']:.1f} us CPU/URL, EVALSHA {r['evalsha_us_per_url']:.1f} us/URL")
            rows += runs
        meter.empty()
        client.close()
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace, load: str) -> str:
    lines = [
        f"# bench push: {args.urls:,} URLs, one per site",
        "",
        f"Load average at the start: {load}. Seeder = `Seeder.seed()` timed around the call; push = the whole"
        " `streams-sched push --file` command (net = without its start-up). Every run, in order:",
        "",
        "| target | kind | how | URLs/s | net URLs/s | client CPU us/URL | Redis CPU us/URL (busiest primary)"
        " | EVALSHA us/URL | Redis bytes/URL | own-core bound URLs/s | load after |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        net = net_text(r["net_urls_per_s"]) if "net_urls_per_s" in r else "-"
        client = f"{r['client_cpu_us_per_url']:.1f}"
        busiest = r["busiest_node_cpu_us_per_url"]
        redis_cpu = f"{r['redis_cpu_us_per_url']:.1f}" + (f" ({busiest:.1f})" if r["target"] == "cluster" else "")
        bound = 1e6 / max(r["client_cpu_us_per_url"], busiest, 1e-9)
        lines.append(
            f"| {r['target']} | {r['kind']} | {r['how']} | {r['urls_per_s']:,.0f} | {net} | {client} |"
            f" {redis_cpu} | {r['evalsha_us_per_url']:.1f} | {r['used_memory_bytes'] / r['urls']:,.0f} |"
            f" {bound:,.0f} | {r['load']} |"
        )
    if args.repeat > 1:
        lines += ["", "Best and median URLs/s over the runs (on a shared machine the best is the one the load"
                  " spoiled least):", "", "| target | kind | how | best | median |", "|---|---|---|---:|---:|"]
        groups: dict[tuple[str, str, str], list[float]] = {}
        for r in rows:
            groups.setdefault((r["target"], r["kind"], r["how"]), []).append(r["urls_per_s"])
        for (target, kind, how), rates in groups.items():
            lines.append(f"| {target} | {kind} | {how} | {max(rates):,.0f} | {statistics.median(rates):,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-push-") as tmp:
        urls, nothing = Path(tmp) / "urls.txt", Path(tmp) / "none.txt"
        urls.write_text("".join(site_url(i) + "\n" for i in range(args.urls)))
        nothing.write_text("")
        for target in args.targets:
            rows += run_target(target, args, urls, nothing)
    text = render(rows, args, load)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"push-{stamp}.json").write_text(json.dumps({"urls": args.urls, "load": load, "rows": rows}, indent=1))
    (args.out / f"push-{stamp}.md").write_text(text)
    return 0
