"""What a pod of each kind needs: the RSS of a worker, the reclaimer and the monitor
on the Compose example's crawl, and how long a worker takes to stop on SIGTERM.

    .venv/bin/python -m bench.pod_memory [--seconds 180] [--pages 5000]

Runs what the image of compose/Dockerfile runs, as the Kubernetes manifests
(deploy/kubernetes/) start it: ``scrapy crawl synthetic`` in compose/example (the
synthetic web through a download handler, 20 sites, 0.05 s a response), the reclaimer
(``--interval 5``) and the monitor, against a throwaway redis-server (with RedisBloom
when it is installed). Every 2 s it reads each process's VmRSS and VmHWM from /proc;
every 15 s it scrapes the three metrics endpoints, as Prometheus would; at the end it
reads each process's CPU time. It also runs
the probes of the manifests once against the live processes (the worker's liveness
command and ``streams-reclaimer --check``) and times them, then sends SIGTERM to the
worker mid-crawl and times its exit, which is what terminationGracePeriodSeconds
must cover.

The numbers set the requests and limits in deploy/kubernetes/ and the sizing part of
docs/operations/kubernetes.md. RSS follows pages crawled (Scrapy's per-site state),
so run it as long as a worker lives between restarts in your crawl, or longer.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from streams_sched.testing import RedisServer, find_redisbloom, free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "compose" / "example"
WORKER_MANIFEST = ROOT / "deploy" / "kubernetes" / "base" / "worker.yaml"


def status_kb(pid: int, field: str) -> int:
    """A field of /proc/PID/status in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (0.0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())
    except OSError:
        return ""


def sample_value(text: str, name: str) -> float:
    """The sum of a metric's samples in an exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def liveness_command(port: int) -> list[str]:
    """The worker's liveness command from the manifest, aimed at ``port``."""
    doc = yaml.safe_load(WORKER_MANIFEST.read_text())
    container = doc["spec"]["template"]["spec"]["containers"][0]
    command = list(container["livenessProbe"]["exec"]["command"])
    return [c.replace("9410", str(port)) for c in command]


def timed(argv: list[str], env: dict[str, str]) -> tuple[int, float, int]:
    """Run a probe command: its exit code, seconds and max RSS (kB)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), time.monotonic() - started, usage.ru_maxrss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pod_memory", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180.0, help="how long the worker crawls until SIGTERM")
    p.add_argument("--sites", type=int, default=20)
    p.add_argument("--pages", type=int, default=5000, help="pages per site (the crawl never runs out at 5000)")
    args = p.parse_args(argv)

    bindir = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="pod-memory-"))
    server = RedisServer(bloom=find_redisbloom() is not None).start()
    ports = {"worker": free_port(), "reclaimer": free_port(), "monitor": free_port()}
    env = dict(os.environ)
    env.update(
        REDIS_URL=server.url, STREAMS_PREFIX="example", SYNTH_SITES=str(args.sites), SYNTH_PAGES=str(args.pages),
        PYTHONPATH=os.pathsep.join([str(EXAMPLE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        subprocess.run([sys.executable, "-m", "example_crawl.seed"], cwd=EXAMPLE, env=env, check=True)
        logs = {name: open(work / f"{name}.log", "wb") for name in ports}
        procs["worker"] = subprocess.Popen(
            [str(bindir / "scrapy"), "crawl", "synthetic", "-s", "STREAMS_CLOSE_ON_DRAIN=False",
             "-s", f"STREAMS_METRICS_PORT={ports['worker']}"],
            cwd=EXAMPLE, env=env, stdout=logs["worker"], stderr=subprocess.STDOUT,
        )
        procs["reclaimer"] = subprocess.Popen(
            [str(bindir / "streams-reclaimer"), "--interval", "5", "--metrics-port", str(ports["reclaimer"])],
            env=env, stdout=logs["reclaimer"], stderr=subprocess.STDOUT,
        )
        procs["monitor"] = subprocess.Popen(
            [str(bindir / "streams-monitor"), "--metrics-port", str(ports["monitor"]),
             "--state-file", str(work / "alerts.json")],
            env=env, stdout=logs["monitor"], stderr=subprocess.STDOUT,
        )
        started = time.monotonic()
        rows: list[dict[str, Any]] = []
        next_scrape = started
        pages = 0.0
        while time.monotonic() - started < args.seconds:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise SystemExit(f"{name} exited with {proc.returncode}; see {work}/{name}.log")
            now = time.monotonic()
            if now >= next_scrape:
                texts = {name: scrape(port) for name, port in ports.items()}
                pages = sample_value(texts["worker"], "streams_sched_worker_acked_total")
                next_scrape = now + 15
            rows.append({"t": now - started, "pages": pages,
                         **{name: status_kb(proc.pid, "VmRSS") for name, proc in procs.items()}})
            time.sleep(2)

        probe_env = dict(env, PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}")
        probes = {
            "worker liveness": timed(liveness_command(ports["worker"]), probe_env),
            "streams-reclaimer --check": timed([str(bindir / "streams-reclaimer"), "--check", "--connect-timeout", "3"], probe_env),
        }
        peaks = {name: status_kb(proc.pid, "VmHWM") for name, proc in procs.items()}
        cpu = {name: cpu_s(proc.pid) / (time.monotonic() - started) for name, proc in procs.items()}
        stops: dict[str, float] = {}
        for name in ("worker", "reclaimer", "monitor"):
            t0 = time.monotonic()
            procs[name].send_signal(signal.SIGTERM)
            procs[name].wait(timeout=120)
            stops[name] = time.monotonic() - t0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()
        server.cleanup()

    print(f"# pod memory, {time.strftime('%Y-%m-%d')}, {args.seconds:g} s, {args.sites} sites, Python {sys.version.split()[0]}")
    print(f"pages crawled by the worker: {pages:.0f} ({pages / args.seconds:.0f}/s)")
    print()
    print("| process | RSS after 10 s | RSS at the end | peak (VmHWM) | CPU (mean, millicores) | SIGTERM to exit |")
    print("|---|---|---|---|---|---|")
    first = next((r for r in rows if r["t"] >= 10), rows[0])
    for name in ("worker", "reclaimer", "monitor"):
        print(f"| {name} | {first[name] / 1024:.0f} MB | {rows[-1][name] / 1024:.0f} MB | {peaks[name] / 1024:.0f} MB | {cpu[name] * 1000:.0f}m | {stops[name]:.1f} s |")
    print()
    print("| probe | exit | time | max RSS |")
    print("|---|---|---|---|")
    for name, (code, seconds, rss) in probes.items():
        print(f"| {name} | {code} | {seconds:.2f} s | {rss / 1024:.0f} MB |")
    print()
    print("RSS over time (MB): t, pages, worker, reclaimer, monitor")
    for r in rows[:: max(1, len(rows) // 12)]:
        print(f"  {r['t']:5.0f} s {r['pages']:7.0f} {r['worker'] / 1024:6.0f} {r['reclaimer'] / 1024:6.0f} {r['monitor'] / 1024:6.0f}")
    print(f"logs: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
