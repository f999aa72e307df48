"""The deployment files: compose, Prometheus config and alert rules, Grafana dashboard, systemd units."""

from __future__ import annotations

import configparser
import importlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from monitor import metric_names as monitor_names

from helpers import find_tool, missing

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"
SERVICES = {"redis", "seed", "worker", "reclaimer", "monitor", "prometheus", "grafana"}
NAME_RE = re.compile(r"\b(streams_sched_[a-z_]+)\b")


def compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


def sample_names(registry: Any) -> set[str]:
    return {s.name for fam in registry.collect() for s in fam.samples}


def exported_names() -> set[str]:
    """Every sample name the monitor, the reclaimer and a worker can expose."""
    from reclaimer.metrics import ReclaimerMetrics
    from streams_sched.worker.metrics import WorkerMetrics

    stats = SimpleNamespace(get_value=lambda key, default=0: 0)
    sched = type("S", (), {"config": SimpleNamespace(crawl="c"), "node_id": "n", "ack_listeners": [], "render_listeners": [],
                           "__len__": lambda self: 0})()
    worker = WorkerMetrics(SimpleNamespace(stats=stats), sched, [0])
    worker.on_ack(None, 0.1)
    worker.on_render(None, 1.5)
    rec = ReclaimerMetrics()
    for counter in rec.moved.values():
        counter.labels("c")  # labelled families expose samples once a label is used
    names = monitor_names() | sample_names(rec.registry) | sample_names(worker.registry)
    return {n for n in names if n.startswith("streams_sched_")}


def test_compose_file_parses_and_names_every_service() -> None:
    """docker-compose.yml is valid YAML with Redis 8, several workers, both daemons, Prometheus and Grafana."""
    services = compose()["services"]
    assert set(services) == SERVICES
    assert services["redis"]["image"].startswith("redis:8")
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["reclaimer"]["command"][0] == "streams-reclaimer"
    assert services["monitor"]["command"][0] == "streams-monitor"
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (COMPOSE / source).exists(), (name, source)
    assert (ROOT / compose()["x-app"]["build"]["dockerfile"]).is_file()


def test_compose_monitor_user_is_read_only_in_the_acl_file() -> None:
    """The monitor connects as the 'monitor' ACL user, which has no write commands."""
    url = compose()["services"]["monitor"]["environment"]["REDIS_URL"]
    user, password = re.match(r"redis://([^:]+):([^@]+)@", url).groups()
    acl = next(line for line in (COMPOSE / "redis/users.acl").read_text().splitlines() if line.startswith(f"user {user} "))
    assert f">{password}" in acl and "-@all" in acl and "+@read" in acl and "+evalsha_ro" in acl
    assert "+@write" not in acl and "+@all" not in acl


def test_prometheus_scrapes_the_ports_the_services_serve() -> None:
    """Prometheus targets the monitor, the reclaimer and every worker on the ports compose gives them."""
    prom = yaml.safe_load((COMPOSE / "prometheus/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    services = compose()["services"]
    assert jobs["streams-monitor"]["static_configs"][0]["targets"] == ["monitor:9108"]
    assert "--metrics-port=9108" in services["monitor"]["command"]
    assert jobs["streams-reclaimer"]["static_configs"][0]["targets"] == ["reclaimer:9411"]
    assert services["reclaimer"]["command"][-2:] == ["--metrics-port", "9411"]
    dns = jobs["streams-worker"]["dns_sd_configs"][0]
    assert dns["names"] == ["worker"] and str(dns["port"]) == services["worker"]["environment"]["STREAMS_METRICS_PORT"]
    for rule_file in prom["rule_files"]:
        assert (COMPOSE / "prometheus" / Path(rule_file).name).is_file()


def test_alert_rules_use_only_exported_metrics() -> None:
    """Every metric in the alert rules (backlog, lag, oldest pending, dead letters, node down) is exported."""
    rules = yaml.safe_load((COMPOSE / "prometheus/alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert {"StreamsSchedBacklogHigh", "StreamsSchedConsumerLagGrowing", "StreamsSchedOldestPendingTooOld",
            "StreamsSchedDeadLettersGrowing", "StreamsSchedNodeDown"} <= set(exprs)
    known = exported_names()
    used = {name for expr in exprs.values() for name in NAME_RE.findall(expr)}
    assert used and used <= known, used - known


def test_grafana_dashboard_uses_only_exported_metrics() -> None:
    """The provisioned dashboard parses, points at the provisioned data source and queries known metrics."""
    dash = json.loads((COMPOSE / "grafana/dashboards/streams-sched.json").read_text())
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    provider = yaml.safe_load((COMPOSE / "grafana/provisioning/dashboards/streams-sched.yml").read_text())["providers"][0]
    mounts = compose()["services"]["grafana"]["volumes"]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") for m in mounts)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert all(t["datasource"]["uid"] == ds["uid"] for p in dash["panels"] for t in p["targets"])
    known = exported_names()
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in NAME_RE.findall(e)}
    assert used <= {re.sub(r"_(bucket|sum|count)$", "", n) for n in known}, used - known


def test_grafana_dashboard_shows_browser_leases_against_the_cap_and_render_time() -> None:
    """The dashboard plots each node's browser leases with its cap in one panel, and render
    time from the workers' histogram."""
    dash = json.loads((COMPOSE / "grafana/dashboards/streams-sched.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    assert any("streams_sched_node_browser_leases" in e and "streams_sched_node_browser_max" in e for e in exprs.values())
    assert any("streams_sched_worker_render_seconds_bucket" in e for e in exprs.values())
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])


@pytest.mark.e2e
def test_promtool_accepts_config_rules_and_rule_tests() -> None:
    """promtool checks the config and the rules, and the rules' unit tests pass (fails under CI without promtool)."""
    promtool = find_tool("promtool", "Debian's prometheus package")
    cwd = COMPOSE / "prometheus"
    for args in (["check", "config", "--syntax-only", "prometheus.yml"], ["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        res = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, (args, res.stdout, res.stderr)


def test_example_project_settings_are_valid() -> None:
    """The example project's settings build a valid StreamsConfig and name the synthetic spider."""
    from streams_sched.config import StreamsConfig
    from streams_sched.worker.metrics import parse_ports

    sys.path.insert(0, str(COMPOSE / "example"))
    try:
        settings = importlib.import_module("example_crawl.settings")
        spider = importlib.import_module("example_crawl.spiders.synthetic").SyntheticSpider
    finally:
        sys.path.remove(str(COMPOSE / "example"))
    values = {k: getattr(settings, k) for k in dir(settings) if k.isupper()}
    cfg = StreamsConfig.from_settings(values, spider.name)
    assert cfg.crawl == "example" and not cfg.close_on_drain
    assert parse_ports(values["STREAMS_METRICS_PORT"])
    assert spider.name in compose()["services"]["worker"]["command"]


UNITS = ["streams-reclaimer.service", "streams-monitor.service", "streams-worker@.service"]


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((COMPOSE / "systemd" / name).read_text())
    return parser


@pytest.mark.parametrize("name", UNITS)
def test_systemd_units_restart_read_an_env_file_and_run_unprivileged(name: str) -> None:
    """Each unit restarts always, reads REDIS_URL from an environment file and runs as a non-root user."""
    u = unit(name)
    assert {"Unit", "Service", "Install"} <= set(u.sections())
    svc = u["Service"]
    assert svc["Restart"] == "always"
    assert svc["EnvironmentFile"].startswith("/etc/")
    assert svc.get("User") and svc["User"] != "root"
    exe = svc["ExecStart"].split()[0]
    assert exe.startswith("/")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(exe).name in set(scripts) | {"scrapy"}
    env = (COMPOSE / "systemd/streams-sched.env.example").read_text()
    assert "REDIS_URL=" in env
    for var in re.findall(r"\$\{(\w+)\}", svc["ExecStart"]):
        assert f"\n{var}=" in "\n" + env, var


def test_the_worker_unit_stops_its_whole_control_group() -> None:
    """A worker's unit signals every process it started, so its browser dies with it."""
    svc = unit("streams-worker@.service")["Service"]
    assert svc["KillMode"] == "control-group" and svc["KillSignal"] == "SIGTERM"


@pytest.mark.e2e
def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    """systemd-analyze verify finds nothing wrong but the binaries missing on this machine (fails under CI without it)."""
    tool = find_tool("systemd-analyze", "apt-get install systemd")
    names = []
    for name in [*UNITS, "streams-workers.target"]:
        target = name.replace("@.", "@1.")
        shutil.copy(COMPOSE / "systemd" / name, tmp_path / target)
        names.append(str(tmp_path / target))
    res = subprocess.run([tool, "verify", "--man=no", *names], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    problems = [
        line for line in (res.stdout + res.stderr).splitlines()
        if line.strip() and "is not executable" not in line and "Failed to" not in line
    ]
    if any("Failed to" in line for line in (res.stdout + res.stderr).splitlines()) and not problems:
        missing(f"systemd-analyze cannot run here: {res.stderr.strip()[:200]}")
    assert problems == [], res.stdout + res.stderr
