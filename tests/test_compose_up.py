"""The Compose stack started for real: compose/docker-compose.yml with podman-compose, the
image built from compose/Dockerfile (tests/podman_tools.py), Redis and Prometheus from
local stand-ins (tests/podman/compose.override.yml changes only their image names).

The stack runs in a network namespace of its own, so the ports it publishes do not meet
the machine's own Redis on 6379; the checks from "the host" run in that namespace and
reach the stack through those published ports. The example crawl runs to its end
(20 sites of 1,000 pages, as the compose file leaves the example's defaults) while one
worker is stopped with ``podman stop`` and another is SIGKILLed; Prometheus, inside the
stack, scrapes every worker, the reclaimer and the monitor, and loads the alert rules.

The tests share one stack and run in this file's order: they follow one crawl.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import wait_for
from podman_tools import (
    COMPOSE_DIR,
    STANDINS,
    Stack,
    built_image,
    compose,
    podman_compose,
    require_podman,
    seconds,
    standins,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.containers]

SERVICES = ["redis", "seed", "worker", "reclaimer", "monitor", "prometheus"]
HOST_REDIS = "redis://127.0.0.1:6379/0"  # the compose file's published 6379, inside the namespace
CRAWL = compose()["services"]["worker"]["environment"]["STREAMS_PREFIX"]
#: the example's synthetic web when the compose file sets neither SYNTH_SITES nor SYNTH_PAGES
SITES, PAGES = 20, 1000
#: who holds how many leases: pending entries per consumer over every stream group
HELD = """
import json, sys, redis
r = redis.Redis.from_url(sys.argv[1], decode_responses=True)
held = {}
for key in r.scan_iter(_type="stream", count=1000):
    try:
        for group in r.xinfo_groups(key):
            for consumer in r.xinfo_consumers(key, group["name"]):
                held[consumer["name"]] = held.get(consumer["name"], 0) + int(consumer["pending"])
    except redis.ResponseError:  # the key went (or changed type) since SCAN named it
        pass
print(json.dumps(held))
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    require_podman()
    podman_compose()
    built_image()
    standins()
    s = Stack()
    try:
        yield s
    finally:
        s.down()


def bare(image: str) -> str:
    """An image name without the registry podman puts in front of a local or Docker Hub name."""
    for prefix in ("localhost/", "docker.io/library/", "docker.io/"):
        image = image.removeprefix(prefix)
    return image


def cli(stack: Stack, *args: str) -> Any:
    """``streams-sched ARGS --json`` run on the host against the stack's published Redis port."""
    exe = str(Path(sys.executable).parent / "streams-sched")
    return json.loads(stack.netns.run([exe, *args, "--json", "--redis-url", HOST_REDIS], timeout=120).stdout)


def totals(stack: Stack) -> dict[str, Any]:
    return dict(cli(stack, "status", "-c", CRAWL, "--all")["totals"])


def held(stack: Stack) -> dict[str, int]:
    return dict(json.loads(stack.netns.run([sys.executable, "-c", HELD, HOST_REDIS]).stdout))


def held_by(stack: Stack, container: str) -> int:
    """Leases held by the worker in ``container``: its node ids start with the container's host name."""
    host = stack.inspect(container)["Config"]["Hostname"]
    return sum(n for consumer, n in held(stack).items() if consumer.startswith(f"{host}-"))


def prometheus(stack: Stack, path: str) -> Any:
    body = json.loads(stack.netns.http_get(f"http://127.0.0.1:9090{path}"))
    assert body["status"] == "success", body
    return body["data"]


def expect(stack: Stack, ok: bool, what: str) -> None:
    if not ok:
        pytest.fail(f"{what}\n{stack.dump()}", pytrace=False)


def test_the_stack_starts_with_the_compose_files_own_commands_variables_ports_volumes_and_health_check(stack: Stack) -> None:
    """podman-compose starts Redis, waits for its health check (`redis-cli ping`), then the seed job, the workers (deploy.replicas), the reclaimer, the monitor and Prometheus, each container with the command, environment, published ports and volumes the compose file gives it."""
    spec = compose()
    stack.compose("up", "-d", "--no-build", "redis")
    (redis,) = stack.names("redis")
    check = spec["services"]["redis"]["healthcheck"]
    # podman keeps a CMD test as CMD-SHELL with the words joined: the same command
    kind, *words = check["test"]
    assert kind == "CMD" and stack.inspect(redis)["Config"]["Healthcheck"]["Test"][1:] in (words, [" ".join(words)])
    # podman 4.3 runs health checks from systemd timers, and podman-compose waits for
    # service_healthy only on podman 4.6: the test runs the check as the timer would,
    # at the compose file's interval, for at most its retries, before starting the rest
    deadline = time.monotonic() + seconds(check["interval"]) * check["retries"]
    while not (ok := stack.healthcheck(redis)) and time.monotonic() < deadline:
        time.sleep(seconds(check["interval"]))
    expect(stack, ok, "Redis never passed its health check")
    stack.compose("up", "-d", "--no-build", *SERVICES[1:])

    (seed,) = stack.names("seed")
    wait_for(lambda: stack.inspect(seed)["State"]["Status"] == "exited", timeout=120, what="the seed job")
    expect(stack, stack.inspect(seed)["State"]["ExitCode"] == 0, "the seed job failed")
    assert f"pushed {SITES} seed(s)" in stack.logs(seed)

    for service in SERVICES:
        svc = spec["services"][service]
        names = stack.names(service)
        assert len(names) == svc.get("deploy", {}).get("replicas", 1), (service, names)
        for name in names:
            info = stack.inspect(name)
            if service != "seed":
                expect(stack, info["State"]["Status"] == "running", f"{name} is {info['State']['Status']}")
            image = STANDINS.get(service, svc["image"])
            assert bare(info["ImageName"]) == bare(image), (name, info["ImageName"], image)
            assert info["Config"]["Cmd"][-len(svc["command"]):] == [str(a) for a in svc["command"]], name
            env = dict(e.split("=", 1) for e in info["Config"]["Env"])
            for key, value in svc.get("environment", {}).items():
                assert env[key] == str(value), (name, key)
            mounts = {m["Destination"]: m for m in info["Mounts"]}
            for volume in svc.get("volumes", []):
                source, dest = volume.split(":")[:2]
                assert dest in mounts, (name, volume)
                if source.startswith("."):
                    assert mounts[dest]["Source"] == str((COMPOSE_DIR / source).resolve()), (name, volume)
                else:
                    assert mounts[dest]["Name"] == f"{stack.project}_{source}", (name, volume, mounts[dest])
            for port in svc.get("ports", []):
                host, inside = str(port).split(":")
                bound = info["HostConfig"]["PortBindings"][f"{inside}/tcp"]
                assert [b["HostPort"] for b in bound] == [host], (name, port, bound)
            assert (info["HostConfig"]["RestartPolicy"]["Name"] or "no") == svc.get("restart", "no"), name

    # the published ports, from the namespace's host side
    assert [c["crawl"] for c in cli(stack, "crawls")] == [CRAWL], "Redis on the published 6379 is not the stack's"
    def metrics() -> bytes | None:  # the monitor listens once its start-up checks of Redis are done
        try:
            return stack.netns.http_get("http://127.0.0.1:9108/metrics")
        except AssertionError:
            return None

    assert b"streams_sched_redis_up" in wait_for(metrics, timeout=60, interval=1, what="the monitor's published port")

    def ready() -> bool:
        try:
            return bool(stack.netns.http_get("http://127.0.0.1:9090/-/ready"))
        except AssertionError:  # not listening yet
            return False

    wait_for(ready, timeout=120, interval=1, what="Prometheus on the published 9090")


def test_podman_stop_hands_back_a_workers_leases_within_its_grace_period(stack: Stack) -> None:
    """`podman stop` with the compose file's stop_grace_period: the worker exits 0 on its own before the grace period ends, and holds no lease after."""
    worker = stack.names("worker")[0]
    grace = seconds(compose()["services"]["worker"]["stop_grace_period"])
    wait_for(lambda: held_by(stack, worker) > 0, timeout=120, interval=0.5, what=f"{worker} to hold leases")
    started = time.monotonic()
    stack.podman("stop", "-t", str(int(grace)), worker, timeout=grace + 60)
    took = time.monotonic() - started
    state = stack.inspect(worker)["State"]
    expect(stack, state["ExitCode"] == 0, f"{worker} exited {state['ExitCode']} after SIGTERM, not 0")
    assert took < grace, f"the stop took {took:.1f} s: podman had to SIGKILL it"
    assert held_by(stack, worker) == 0, "the stopped worker still holds leases"
    stack.podman("start", worker)
    wait_for(lambda: stack.inspect(worker)["State"]["Status"] == "running", timeout=60, what=f"{worker} to run again")


def test_a_worker_sigkilled_inside_the_stack_loses_nothing_and_the_crawl_ends_with_every_page(stack: Stack) -> None:
    """A worker holding leases is SIGKILLed (restart: unless-stopped starts it again); the reclaimer hands its leases to the others, and the crawl ends with all 20,000 pages enqueued once and acked, nothing pending, delayed or dead."""
    victim = stack.names("worker")[1]
    wait_for(lambda: held_by(stack, victim) > 0, timeout=120, interval=0.5, what=f"{victim} to hold leases")
    lost = held_by(stack, victim)
    restarts = stack.inspect(victim)["RestartCount"]
    stack.kill_main_process(victim)
    wait_for(lambda: stack.inspect(victim)["RestartCount"] > restarts and stack.inspect(victim)["State"]["Status"] == "running",
             timeout=60, what=f"{victim} to be started again")
    assert stack.inspect(victim)["State"]["Status"] == "running"

    def done() -> dict[str, Any] | None:
        t = totals(stack)
        left = t["backlog"] + t["pending"] + t["delayed"]
        return t if t["enqueued"] > 0 and left == 0 and t["acked"] + t["dead"] == t["enqueued"] else None

    t = wait_for(done, timeout=1800, interval=10, what="the crawl to end")
    assert t["enqueued"] == SITES * PAGES, t
    assert t["acked"] == SITES * PAGES and t["dead"] == 0, t
    assert t["sites"] == SITES, t
    assert lost > 0
    # the killed worker's leases were taken over: requeued by the reclaimer, or claimed by a worker
    query = "(sum(streams_sched_reclaimer_requeued_total) or vector(0)) + (sum(streams_sched_worker_reclaimed_total) or vector(0))"
    taken = prometheus(stack, "/api/v1/query?" + urllib.parse.urlencode({"query": query}))["result"]
    assert float(taken[0]["value"][1]) >= 1, taken


def test_prometheus_in_the_stack_scrapes_every_worker_the_reclaimer_and_the_monitor_all_up(stack: Stack) -> None:
    """Prometheus's targets are the three workers (found through the network's DNS), the reclaimer and the monitor, every one up, and worker series carry the crawl's name."""
    replicas = compose()["services"]["worker"]["deploy"]["replicas"]
    jobs = {j["job_name"] for j in yaml.safe_load((COMPOSE_DIR / "prometheus/prometheus.yml").read_text())["scrape_configs"]}

    def all_up() -> list[dict[str, Any]] | None:
        active = prometheus(stack, "/api/v1/targets")["activeTargets"]
        by_job = {job: [t for t in active if t["labels"]["job"] == job] for job in jobs}
        counts = {job: len(ts) for job, ts in by_job.items()}
        if counts != {"streams-worker": replicas, "streams-reclaimer": 1, "streams-monitor": 1}:
            return None
        return active if all(t["health"] == "up" for t in active) else None

    active = wait_for(all_up, timeout=180, interval=5, what="every Prometheus target up")
    assert {t["labels"]["job"] for t in active} == jobs
    up = prometheus(stack, "/api/v1/query?query=up")["result"]
    assert len(up) == replicas + 2 and all(r["value"][1] == "1" for r in up), up
    stuck = prometheus(stack, "/api/v1/query?query=streams_sched_worker_io_stuck_seconds")["result"]
    assert {r["metric"]["crawl"] for r in stuck} == {CRAWL} and len(stuck) == replicas, stuck


def test_prometheus_in_the_stack_loads_the_alert_rules(stack: Stack) -> None:
    """Every alert of compose/prometheus/alerts.yml is loaded from the mounted file and evaluates without error."""
    shipped = yaml.safe_load((COMPOSE_DIR / "prometheus/alerts.yml").read_text())
    want = {r["alert"] for g in shipped["groups"] for r in g["rules"] if "alert" in r}

    def loaded() -> list[dict[str, Any]] | None:
        rules = [r for g in prometheus(stack, "/api/v1/rules")["groups"] for r in g["rules"]]
        return rules if {r["name"] for r in rules} == want and all("lastEvaluation" in r and not r["lastEvaluation"].startswith("0001") for r in rules) else None

    rules = wait_for(loaded, timeout=120, interval=5, what="the alert rules evaluated")
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad
