"""``python -m bench transfer``: how fast ``streams-sched dump`` and ``load`` move a crawl, against ``push``.

N queued requests on N / 100 sites (``http://s{site}.test/p{page}``, 100 pages a site),
on a throwaway redis-server with RedisBloom (``single``) or a 3-master LocalCluster
(``cluster``). Each command runs as its own process, as an operator runs it, timed from
start to exit:

- ``push``: ``streams-sched push --file`` of the N URLs into an emptied Redis, the
  rate the other two are compared with (the same URLs, the same run);
- ``dump``: ``streams-sched dump -o FILE`` of that crawl (``--gzip``: FILE.gz as well);
- ``load``: ``streams-sched load`` of FILE into another crawl of the same Redis, emptied
  of the first (its seen filters too: a load into a crawl of its own);
- ``move`` (``--move``): ``streams-sched move`` of the pushed crawl into a second
  throwaway redis-server (``--lease-seconds 0``: no worker holds a lease), the dump and
  the load in one process with no file between; its row says how long leasing stopped.

Every run checks that what it reports is exact (N pushed, N dumped, N loaded). Each
row gives the command's requests per second, its ratio to push in the same round, its
CPU seconds and its peak RSS (``wait4``), and with ``--sizes`` the same at several
sizes: memory that stays flat from the smallest to the largest is what the dump and the
load promise. Redis CPU per request is INFO cpu over the primaries.

    python -m bench transfer                        # 1,000,000 requests, 10,000 sites, single Redis
    python -m bench transfer --sizes 100000,1000000 --gzip
    python -m bench transfer --targets single,cluster --kinds streams-sched,streams-sched@main
    python -m bench transfer --move                 # and a move into a second Redis
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .crawl import python_for
from .push import RedisMeter, balanced_crawl
from .sites import RESULTS

TARGETS = ("single", "cluster")
PER_SITE = 100


def say(text: str) -> None:
    print(f"[bench transfer] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench transfer", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000000", help="comma-separated request counts (default 1e6; 100 a site)")
    p.add_argument("--targets", default="single", help="comma-separated: single, cluster (default single)")
    p.add_argument("--kinds", default="streams-sched", help="streams-sched kinds; KIND@REV runs that revision")
    p.add_argument("--gzip", action="store_true", help="also dump to, and load from, a .gz file")
    p.add_argument("--move", action="store_true", help="also move the crawl into a second redis-server")
    p.add_argument("--repeat", type=int, default=1, help="rounds (default 1)")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.sizes = [int(float(s)) for s in a.sizes.split(",")]
    a.targets = a.targets.split(",")
    a.kinds = a.kinds.split(",")
    for t in a.targets:
        if t not in TARGETS:
            p.error(f"unknown target {t!r} (one of {', '.join(TARGETS)})")
    return a


def timed(kind: str, args: list[str]) -> tuple[str, float, float, int]:
    """``python -m streams_sched.cli ARGS`` with the streams_sched of ``kind``: (its stderr and
    stdout, wall s, CPU s, peak RSS in KiB), measured with wait4 on that process alone."""
    cwd, env = python_for(kind)
    out = tempfile.TemporaryFile()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "streams_sched.cli", *args], cwd=cwd, env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"streams-sched {args[0]} ({kind}) exited with {proc.returncode}:\n{text[-3000:]}")
    return text, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def count(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"no {pattern!r} in {text[-2000:]!r}")
    return int(m.group(1))


def one_round(kind: str, target: str, url: str, client: Any, meter: RedisMeter, n: int, urls: Path, tmp: Path,
              gzip: bool, label: str, move_to: Any = None) -> list[dict[str, Any]]:
    crawl = balanced_crawl(client, f"benchtransfer{label}-")
    rows = []
    meter.empty()

    def row(how: str, wall: float, cpu: float, rss_kib: int, before: dict[str, Any], size: int = 0) -> dict[str, Any]:
        r = {"target": target, "kind": kind, "how": how, "requests": n, "seconds": wall, "per_s": n / wall,
             "cpu_s": cpu, "max_rss_mb": rss_kib / 1024, "file_bytes": size,
             "load": " ".join(f"{x:.2f}" for x in os.getloadavg()), **meter.since(before, n)}
        say(f"{target} {kind} {how} of {n:,}: {r['per_s']:,.0f} requests/s, {cpu:.1f} s CPU, peak RSS"
            f" {r['max_rss_mb']:.0f} MB, Redis {r['redis_cpu_us_per_url']:.1f} us CPU/request")
        return r

    before = meter.read()
    text, wall, cpu, rss = timed(kind, ["push", "--redis-url", url, "--crawl", crawl, "--file", str(urls)])
    if count(r"pushed (\d+) request", text) != n:
        raise RuntimeError(f"push: {text}")
    rows.append(row("push", wall, cpu, rss, before))
    files = [tmp / f"{crawl}.jsonl"] + ([tmp / f"{crawl}.jsonl.gz"] if gzip else [])
    for path in files:
        before = meter.read()
        text, wall, cpu, rss = timed(kind, ["dump", "--redis-url", url, "--crawl", crawl, "-o", str(path)])
        if count(r"dumped (\d+) request", text) != n:
            raise RuntimeError(f"dump: {text}")
        rows.append(row("dump" + (" .gz" if path.name.endswith(".gz") else ""), wall, cpu, rss, before,
                        path.stat().st_size))
    for i, path in enumerate(files):
        into = f"{crawl}-loaded{i}"
        before = meter.read()
        text, wall, cpu, rss = timed(kind, ["load", "--redis-url", url, "--crawl", into, str(path)])
        if count(r"(\d+) request\(s\) added", text) != n:
            raise RuntimeError(f"load: {text}")
        rows.append(row("load" + (" .gz" if path.name.endswith(".gz") else ""), wall, cpu, rss, before))
        for key in client.scan_iter(match=f"ss:{{{into}*", count=10_000) if not hasattr(client, "get_primaries") else ():
            client.unlink(key)
        path.unlink()
    if move_to is not None:
        before = meter.read()
        text, wall, cpu, rss = timed(kind, ["move", "--redis-url", url, "--crawl", crawl, "--to", move_to.url,
                                            "--lease-seconds", "0"])
        if count(r": (\d+) request\(s\) of", text) != n:
            raise RuntimeError(f"move: {text}")
        stopped = float(re.search(r"leasing stopped for ([\d.]+)s", text).group(1))  # type: ignore[union-attr]
        rows.append(row(f"move (leasing stopped {stopped:.1f} s)", wall, cpu, rss, before))
        rows[-1]["leasing_stopped_s"] = stopped
        target_client = connect_to(move_to.url)
        target_client.flushall()
        target_client.close()
    push = rows[0]["per_s"]
    for r in rows:
        r["vs_push"] = r["per_s"] / push
    return rows


def connect_to(url: str) -> Any:
    from streams_sched.connect.clients import connect

    return connect(url)


def run_target(target: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    from streams_sched.connect.clients import connect
    from streams_sched.testing import RedisServer, find_redisbloom
    from tests.redis_tools import LocalCluster

    bloom = find_redisbloom() is not None
    server: Any = RedisServer(bloom=bloom) if target == "single" else LocalCluster(3, bloom=bloom)
    rows: list[dict[str, Any]] = []
    move_to: Any = RedisServer(bloom=bloom).start() if args.move else None
    with server:
        client = connect(server.url)
        meter = RedisMeter(client)
        for r in range(args.repeat):
            for n in args.sizes:
                urls = tmp / f"urls-{n}.txt"
                if not urls.exists():
                    sites = max(1, n // PER_SITE)
                    with open(urls, "w") as fh:
                        for page in range(PER_SITE):
                            fh.writelines(f"http://s{s}.test/p{page}\n" for s in range(sites))
                for i, kind in enumerate(args.kinds):
                    rows += one_round(kind, target, server.url, client, meter, n, urls, tmp, args.gzip, f"{r}{i}{n}",
                                      move_to)
        meter.empty()
        client.close()
    if move_to is not None:
        move_to.cleanup()
    return rows


def render(rows: list[dict[str, Any]], args: argparse.Namespace, load: str) -> str:
    lines = [
        f"# bench transfer: {', '.join(f'{n:,}' for n in args.sizes)} queued requests, {PER_SITE} a site",
        "",
        f"Load average at the start: {load}. Each command is its own process, timed from start to exit (its"
        " start-up included); x push = its requests/s against `streams-sched push` of the same URLs in the same"
        " round. Every run, in order:",
        "",
        "| target | kind | requests | command | requests/s | x push | CPU s | peak RSS MB | Redis CPU us/request"
        " | file MB | load after |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        size = f"{r['file_bytes'] / 1e6:,.0f}" if r["file_bytes"] else "-"
        lines.append(
            f"| {r['target']} | {r['kind']} | {r['requests']:,} | {r['how']} | {r['per_s']:,.0f} | {r['vs_push']:.2f} |"
            f" {r['cpu_s']:.1f} | {r['max_rss_mb']:.0f} | {r['redis_cpu_us_per_url']:.1f} | {size} | {r['load']} |")
    if len(args.sizes) > 1:
        lines += ["", "Peak RSS by size (flat: the dump and the load hold a round trip's worth, not the crawl):", "",
                  "| command | " + " | ".join(f"{n:,}" for n in args.sizes) + " |",
                  "|---|" + "---:|" * len(args.sizes)]
        for how in dict.fromkeys(r["how"] for r in rows):
            cells = [statistics.median([r["max_rss_mb"] for r in rows if r["how"] == how and r["requests"] == n] or [0])
                     for n in args.sizes]
            lines.append(f"| {how} | " + " | ".join(f"{c:.0f} MB" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as tmp:
        for target in args.targets:
            rows += run_target(target, args, Path(tmp))
    text = render(rows, args, load)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"transfer-{stamp}.json").write_text(json.dumps({"sizes": args.sizes, "load": load, "rows": rows},
                                                                indent=1))
    (args.out / f"transfer-{stamp}.md").write_text(text)
    return 0
