"""The image of compose/Dockerfile, built and run with podman (tests/podman_tools.py): it
builds from this checkout on a local Debian base, offline from a wheelhouse; it is small,
has no compilers or caches and runs as its unprivileged user; every command and probe of
deploy/kubernetes runs in it, as the manifests' security context says, against a Redis
with the overlay's ACL users; and testcontainers drives podman through its API socket.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import yaml

from helpers import wait_for
from podman_tools import (
    BASE_IMAGE,
    IMAGE,
    STANDINS,
    ApiService,
    Netns,
    built_image,
    image_size,
    podman,
    require_podman,
    run_in_image,
    standins,
)
from test_compose_stack import image_user, programs, spider_names
from test_kubernetes import KUBE, OVERLAYS, env_of, exec_probes, expand, rendered

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.containers]

#: what streams-sched adds to its base (the virtualenv and the example project), at most
ADDED_BYTES_MAX = 130 * 1000 * 1000


@pytest.fixture(scope="module")
def image() -> str:
    require_podman()
    return built_image().name


def test_the_image_builds_offline_from_the_checkout_on_a_local_base(image: str) -> None:
    """compose/Dockerfile builds with BASE and the wheelhouse given as build arguments, with no network; the default BASE stays the public python:3.11-slim."""
    from podman_tools import DOCKERFILE

    assert re.search(r"^ARG BASE=python:3\.11-slim$", DOCKERFILE.read_text(), re.M)
    history = podman("image", "history", "--format", "{{.CreatedBy}}", image).stdout
    assert "streams-sched" in history and podman("image", "exists", image).returncode == 0
    version = run_in_image("python", "-c", "import importlib.metadata as m; print(m.version('streams-sched'))")
    assert version.returncode == 0 and version.stdout.strip() == "0.1.0", version


def test_the_image_is_small_with_no_compiler_no_cache_and_an_unprivileged_user(image: str) -> None:
    """What the project adds to its base stays small; no compiler, no pip or apt cache, no build sources, pip or setuptools; it runs as the Dockerfile's user, not root."""
    built = built_image()
    added = built.size - image_size(BASE_IMAGE)
    assert 0 < added < ADDED_BYTES_MAX, f"the image adds {added / 1e6:.0f} MB to its base"
    user, uid = image_user()
    assert run_in_image("id", "-u").stdout.strip() == str(uid)
    assert run_in_image("id", "-un").stdout.strip() == user
    script = (
        "for c in gcc cc c++ clang make ld; do command -v $c; done; "
        "ls -d /root/.cache /home/*/.cache /src /wheels /var/cache/apt/archives/*.deb 2>/dev/null; "
        "ls /var/lib/apt/lists 2>/dev/null | grep -v -e '^lock$' -e '^partial$'; "
        "find / -xdev \\( -name '*.whl' -o -path '*/pip/http*' \\) -not -path '/usr/share/python-wheels/*' 2>/dev/null; "
        "python -c 'import setuptools' 2>/dev/null && echo setuptools; "
        "python -c 'import pip' 2>/dev/null && echo pip; true"
    )
    res = run_in_image("sh", "-c", script)
    assert res.returncode == 0 and res.stdout.strip() == "", f"found in the image:\n{res.stdout}"


def test_the_image_has_every_program_the_compose_file_and_the_manifests_start(image: str) -> None:
    """Each entry point answers --help in the image, and `scrapy list` in its working directory names the example's spider."""
    for program in sorted(programs() - {"python", "scrapy"}):
        res = run_in_image(program, "--help")
        assert res.returncode == 0 and "Usage" in res.stdout, (program, res.stdout, res.stderr)
    res = run_in_image("scrapy", "list")
    assert res.returncode == 0 and set(res.stdout.split()) == spider_names(), res


# -- deploy/kubernetes in the image ----------------------------------------------------------


class Cluster:
    """A stand-in for the cluster's network: a podman network in a namespace of the test's
    own, with the Redis stand-in under the host name of the overlay's REDIS_URL."""

    def __init__(self, objs: tuple[dict[str, Any], ...]) -> None:
        self.objs = objs
        self.id = uuid.uuid4().hex[:8]
        self.netns = Netns(f"streams-sched-k8s-{self.id}")
        self.network = f"streams-sched-k8s-{self.id}"
        self.started: list[str] = []
        try:
            self.p("network", "create", self.network)
            urls = {urllib.parse.urlsplit(v) for c in self.containers() for k, v in env_of(objs, c).items() if k == "REDIS_URL"}
            hosts = {u.hostname for u in urls}
            assert len(hosts) == 1, hosts
            # published inside the namespace only: the test sets the ACL users through it
            self.redis = self.run("redis", STANDINS["redis"], [], alias=hosts.pop(), options=("--publish=6379:6379",))
            wait_for(lambda: self.exec(self.redis, ["redis-cli", "ping"]).stdout.strip() == "PONG", timeout=30, what="redis")
            self.users(urls)
        except BaseException:
            self.close()
            raise

    def p(self, *args: str, check: bool = True, timeout: float = 120) -> Any:
        return podman(*args, netns=self.netns.path, check=check, timeout=timeout)

    def containers(self) -> list[dict[str, Any]]:
        return [c for d in self.objs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]]

    def users(self, urls: set[urllib.parse.SplitResult]) -> None:
        """The overlay's ACL users: the monitor's with the monitor role's rules (read-only),
        the others' with every right (the workers' and the reclaimer's roles together)."""
        for u in urls:
            if u.username == "monitor":
                self.redis_py("from streams_sched.admin.acl import setuser; setuser(r, sys.argv[2], sys.argv[3], 'monitor')",
                              u.username, str(u.password))
            elif u.username:
                res = self.exec(self.redis, ["redis-cli", "ACL", "SETUSER", u.username, "reset", "on", f">{u.password}",
                                             "~*", "&*", "+@all"])
                assert res.stdout.strip() == "OK", res

    def redis_py(self, code: str, *args: str) -> str:
        """Python with ``r``, a redis-py client of the stand-in (through its port in the
        namespace), and ``sys.argv[2:]`` = ``args``; returns what it prints."""
        prelude = "import json, sys, redis; r = redis.Redis.from_url(sys.argv[1]); "
        return self.netns.run([sys.executable, "-c", prelude + code, "redis://127.0.0.1:6379/0", *args]).stdout

    def run(self, name: str, image: str, argv: list[str], alias: str | None = None, options: tuple[str, ...] = ()) -> str:
        cname = f"{self.network}-{name}"
        extra = ["--network-alias", alias] if alias else []
        self.p("run", "-d", "--name", cname, "--hostname", cname, "--network", self.network, *extra, *options, image, *argv)
        self.started.append(cname)
        return cname

    def exec(self, name: str, argv: list[str], timeout: float = 60) -> Any:
        return self.p("exec", name, *argv, check=False, timeout=timeout)

    def logs(self, name: str) -> str:
        res = self.p("logs", name, check=False)
        return str(res.stdout + res.stderr)

    def close(self) -> None:
        for name in reversed(self.started):
            self.p("rm", "-f", "-v", "-t", "3", name, check=False)
        self.p("network", "rm", "-f", self.network, check=False)
        self.netns.close()


@pytest.fixture(scope="module")
def cluster(image: str) -> Iterator[Cluster]:
    standins()
    c = Cluster(rendered("single-redis"))
    try:
        yield c
    finally:
        c.close()


def run_options(pod: dict[str, Any], c: dict[str, Any]) -> tuple[str, ...]:
    """podman run options for a pod's container: its user, capabilities, privilege
    escalation, read-only root and volumes as the manifest says."""
    opts = [f"--user={pod['securityContext']['runAsUser']}"]
    sec = c.get("securityContext", {})
    if sec.get("readOnlyRootFilesystem"):
        opts.append("--read-only")
    if sec.get("allowPrivilegeEscalation") is False:
        opts.append("--security-opt=no-new-privileges")
    for cap in sec.get("capabilities", {}).get("drop", []):
        opts.append(f"--cap-drop={cap}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        # an emptyDir: empty when the pod starts, writable by the pod's user (an anonymous
        # volume takes the image directory's owner; a tmpfs over it here stays root's 0755)
        assert "emptyDir" in volumes[mount["name"]], mount
        opts.append(f"--volume={mount['mountPath']}")
    return tuple(opts)


def http_probe(cluster: Cluster, name: str, c: dict[str, Any], probe: dict[str, Any]) -> bool:
    """An httpGet probe, from inside the pod's network as the kubelet reaches it."""
    port = probe["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == port)
    code = ("import sys, urllib.request; r = urllib.request.urlopen(sys.argv[1], timeout=5); "
            "sys.exit(0 if 200 <= r.status < 400 else 1)")
    return cluster.exec(name, ["python", "-c", code, f"http://127.0.0.1:{port}{probe['path']}"]).returncode == 0


def deployments() -> list[str]:
    """The Deployments of deploy/kubernetes/base (read without kubectl: this runs at collection)."""
    docs = [d for f in sorted((KUBE / "base").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Deployment")


def test_the_overlays_run_the_same_commands_and_probes() -> None:
    """Both overlays give each Deployment the same image, command and probes (they differ only in the Redis URLs), so running one overlay's runs both."""
    def shape(overlay: str) -> dict[str, Any]:
        return {o["metadata"]["name"]: [(c["image"], c["command"], c.get("args"), exec_probes(c))
                                        for c in o["spec"]["template"]["spec"]["containers"]]
                for o in rendered(overlay) if o["kind"] == "Deployment"}

    assert len(OVERLAYS) >= 2 and all(shape(o) == shape(OVERLAYS[0]) for o in OVERLAYS)


@pytest.mark.parametrize("deployment", deployments())
def test_each_kubernetes_container_runs_in_the_image_and_passes_its_probes(cluster: Cluster, deployment: str) -> None:
    """The Deployment's container runs in the built image with its command, environment (the Redis URL pointed at the test's Redis, its ACL user kept) and security context, and its startup, readiness and liveness probes pass: exec probes run in the container, httpGet probes are fetched on the port they name."""
    pod = next(o for o in cluster.objs if o["kind"] == "Deployment" and o["metadata"]["name"] == deployment)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == IMAGE
    inspect = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Config"]
    assert not inspect.get("Entrypoint"), "a manifest's command replaces the entry point: the image must have none"
    env = env_of(cluster.objs, c)
    argv = expand(c["command"] + c.get("args", []), env)
    options = run_options(pod, c) + tuple(f"--env={k}={v}" for k, v in env.items())
    name = cluster.run(deployment, IMAGE, argv, options=options)

    def passes(probe: dict[str, Any]) -> bool:
        if "exec" in probe:
            return cluster.exec(name, probe["exec"]["command"], timeout=probe.get("timeoutSeconds", 10) + 30).returncode == 0
        return http_probe(cluster, name, c, probe["httpGet"])

    def running() -> bool:
        state = json.loads(cluster.p("inspect", name).stdout)[0]["State"]
        assert state["Status"] == "running", f"{name} exited {state['ExitCode']}:\n{cluster.logs(name)[-4000:]}"
        return True

    probes = {kind: c[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in c}
    assert probes, f"{deployment} has no probe"
    first = probes.get("startupProbe") or probes.get("readinessProbe")
    assert first is not None
    limit = first.get("failureThreshold", 3) * first.get("periodSeconds", 10) + first.get("initialDelaySeconds", 0)
    wait_for(lambda: running() and passes(first), timeout=limit, interval=1, what=f"{deployment}'s first probe")
    for kind, probe in probes.items():
        assert passes(probe), f"{deployment}'s {kind} fails:\n{cluster.logs(name)[-4000:]}"
    assert running()
    if deployment == "streams-monitor":
        metrics = cluster.exec(name, ["python", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9108/metrics').read().decode())"])
        assert re.search(r"^streams_sched_redis_up 1(\.0)?$", metrics.stdout, re.M), "the monitor does not reach Redis as its read-only user"
    user = urllib.parse.urlsplit(env["REDIS_URL"]).username
    denied = json.loads(cluster.redis_py("from streams_sched.admin.acl import denials; print(json.dumps(denials(r, sys.argv[2])))", str(user)))
    assert not denied, f"{deployment} was refused commands as {user}: {denied}"


# -- testcontainers on podman's socket -------------------------------------------------------


@pytest.fixture(scope="module")
def api() -> Iterator[ApiService]:
    require_podman()
    standins()
    service = ApiService()
    try:
        yield service
    finally:
        service.close()


def test_testcontainers_starts_the_redis_stand_in_through_podmans_api_socket(api: ApiService) -> None:
    """With DOCKER_HOST at `podman system service`, testcontainers' RedisContainer starts the Redis stand-in, publishes its port, and the frontier's RedisBloom check passes on it."""
    from podman_tools import redis_container

    ids = []
    with api.as_docker_host():
        url, container = redis_container(bloom=True)
        try:
            ids.append(container.get_wrapped_container().id)
            client = redis.Redis.from_url(url)
            assert client.ping()
            assert client.execute_command("BF.ADD", "ss:probe", "x") in (1, True)
            plain_url, plain = redis_container(bloom=False)
            try:
                ids.append(plain.get_wrapped_container().id)
                with pytest.raises(redis.ResponseError):
                    redis.Redis.from_url(plain_url).execute_command("BF.ADD", "ss:probe", "x")
            finally:
                plain.stop()
        finally:
            container.stop()
    assert all(podman("container", "exists", i, check=False).returncode == 1 for i in ids), "stop() left a container"
