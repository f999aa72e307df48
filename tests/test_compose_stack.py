"""The Docker Compose stack (compose/), checked in-process: nothing here starts a container
(tests/test_compose_up.py starts the stack with podman, tests/test_image.py builds and runs
the image). What is checked is what a start would trip over first, and what a container
run would not show: each service runs a program the image of compose/Dockerfile has, with options its
real command line takes; every environment variable a service is given is read by its
program; volumes are declared and mounted where the programs and the image expect them;
the Dockerfile copies what ``pip install .`` and ``scrapy crawl`` need; Redis's health
check works with the ACL file. tests/test_deploy_files.py checks Prometheus, Grafana and
the systemd units.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"
EXAMPLE = COMPOSE / "example"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((COMPOSE / "docker-compose.yml").read_text()))


def app_services() -> dict[str, dict[str, Any]]:
    """The services that run the image built from compose/Dockerfile."""
    image = compose()["x-app"]["image"]
    return {name: svc for name, svc in compose()["services"].items() if svc.get("image") == image}


def dockerfile() -> list[tuple[str, str]]:
    """compose/Dockerfile as (instruction, arguments), continuation lines joined."""
    text = (COMPOSE / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def image_user() -> tuple[str, int]:
    """The image's USER and the uid useradd gives it."""
    user = [args for op, args in dockerfile() if op == "USER"][-1]
    run = next(args for op, args in dockerfile() if op == "RUN" and "useradd" in args)
    uid = int(re.search(r"--uid (\d+)", run).group(1))
    assert run.split()[-1] == user
    return user, uid


def workdir() -> str:
    return [args for op, args in dockerfile() if op == "WORKDIR"][-1]


def copies() -> dict[str, str]:
    """COPY destination -> source, for the copies from the build context (the repository
    root); a ``COPY --from=STAGE`` copies between stages, not from the context."""
    out = {}
    for op, args in dockerfile():
        if op == "COPY" and "--from=" not in args:
            *sources, dest = [a for a in args.split() if not a.startswith("--")]
            for source in sources:
                out[dest.rstrip("/") + ("/" + source if dest.endswith("/") else "")] = source
    return out


def dockerignore_allows(path: str) -> bool:
    """Whether .dockerignore (at the build context's root) leaves ``path`` in the context:
    the last matching pattern decides, ``!`` re-includes (Docker's rules, for the plain
    patterns the file uses)."""
    import fnmatch

    allowed = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            allowed = keep
    return allowed


def programs() -> set[str]:
    """What the image can run: the project's entry points (pip install .), scrapy (a dependency), python."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return set(scripts) | {"scrapy", "python"}


def daemon(program: str) -> click.Command:
    from monitor.__main__ import main as monitor_main
    from reclaimer.__main__ import main as reclaimer_main

    return {"streams-reclaimer": reclaimer_main, "streams-monitor": monitor_main}[program]


def spider_names() -> set[str]:
    """The spiders of the example project, as `scrapy crawl` finds them from its settings."""
    from scrapy.settings import Settings
    from scrapy.spiderloader import SpiderLoader

    sys.path.insert(0, str(EXAMPLE))
    try:
        import example_crawl.settings as settings

        loader = SpiderLoader.from_settings(Settings({"SPIDER_MODULES": settings.SPIDER_MODULES}))
        return set(loader.list())
    finally:
        sys.path.remove(str(EXAMPLE))


def test_the_dockerfile_copies_the_package_and_the_example_project() -> None:
    """Every COPY source exists, each package pyproject installs and its readme are copied ahead of `pip install .`, and the final WORKDIR is the example project, where `scrapy crawl` finds scrapy.cfg."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = copies()
    for source in copied.values():
        assert (ROOT / source).exists(), source
    sources = set(copied.values())
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in sources, f"{pattern} is installed but not copied"
    assert {"pyproject.toml", project["project"]["readme"]} <= sources
    install = next(i for i, (op, args) in enumerate(dockerfile()) if op == "RUN" and "pip install" in args)
    copied_first = {args.split()[0] for op, args in dockerfile()[:install] if op == "COPY"}
    assert {"pyproject.toml", "streams_sched", "reclaimer", "monitor"} <= copied_first
    assert copied[workdir()] == "compose/example"
    assert (EXAMPLE / "scrapy.cfg").is_file()


def test_the_dockerignore_keeps_what_the_dockerfile_copies_and_only_that() -> None:
    """Every COPY source stays in the build context; the virtualenv, .git and the tests do not (a Docker engine is sent the whole context)."""
    for source in copies().values():
        assert dockerignore_allows(source), f"{source} is copied but .dockerignore leaves it out"
    for heavy in (".venv", ".git", "tests", "bench", "docs", "compose/grafana"):
        assert not dockerignore_allows(heavy), heavy


def test_the_image_runs_as_an_unprivileged_user() -> None:
    """USER is the account the Dockerfile creates, not root; the Kubernetes manifests run as its uid."""
    user, uid = image_user()
    assert user != "root" and uid >= 1000
    worker = yaml.safe_load((ROOT / "deploy/kubernetes/base/worker.yaml").read_text())
    assert worker["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


@pytest.mark.parametrize("service", sorted(app_services()))
def test_each_service_runs_a_program_the_image_has_with_options_it_takes(service: str) -> None:
    """A daemon's command parses with its real click command; `scrapy crawl` names a spider of the example project; `python -m` a module it has."""
    argv = [str(a) for a in app_services()[service]["command"]]
    assert argv[0] in programs(), argv
    if argv[0].startswith("streams-"):
        daemon(argv[0]).make_context(argv[0], argv[1:])
    elif argv[0] == "scrapy":
        assert argv[1] == "crawl" and argv[2] in spider_names()
    else:
        assert argv[1] == "-m"
        assert (EXAMPLE / (argv[2].replace(".", "/") + ".py")).is_file(), f"{argv[2]} is not in {workdir()}"


def env_read_by_project() -> set[str]:
    """Environment variables the example project reads, and those streams-sched's settings read when unset."""
    text = "\n".join(p.read_text() for p in EXAMPLE.rglob("*.py"))
    names = set(re.findall(r"os\.environ(?:\.get\(|\[)\"(\w+)\"", text))
    config = (ROOT / "streams_sched/config.py").read_text()
    return names | set(re.findall(r"_env(?:_flag)?\(\"(\w+)\"", config))


def env_read_by(command: click.Command) -> set[str]:
    """The variables a click command reads: explicit envvars and the auto_envvar_prefix ones."""
    prefix = (command.context_settings or {}).get("auto_envvar_prefix")
    names: set[str] = set()
    for param in command.params:
        if param.envvar:
            names |= {param.envvar} if isinstance(param.envvar, str) else set(param.envvar)
        elif prefix and isinstance(param, click.Option):
            names.add(f"{prefix}_{param.name.upper()}")
    return names


def test_the_readers_of_the_environment_are_found() -> None:
    """The derivations see REDIS_URL, the daemons' own prefixes and the example's STREAMS_PREFIX, so the next test can fail."""
    assert {"REDIS_URL", "STREAMS_RECLAIMER_INTERVAL"} <= env_read_by(daemon("streams-reclaimer"))
    assert "STREAMS_MONITOR_BACKLOG_THRESHOLD" in env_read_by(daemon("streams-monitor"))
    assert {"REDIS_URL", "STREAMS_PREFIX", "STREAMS_METRICS_PORT"} <= env_read_by_project()


@pytest.mark.parametrize("service", sorted(app_services()))
def test_every_environment_variable_a_service_gets_is_read_by_its_program(service: str) -> None:
    """A variable nothing reads is a setting that silently does nothing (a daemon reads STREAMS_RECLAIMER_*, not STREAMS_PREFIX)."""
    svc = app_services()[service]
    program = str(svc["command"][0])
    readers = env_read_by(daemon(program)) if program.startswith("streams-") else env_read_by_project()
    unread = set(svc.get("environment", {})) - readers
    assert not unread, f"{service} is given {sorted(unread)}, which {program} does not read"


def test_volumes_are_declared_and_mounted_where_the_programs_expect_them() -> None:
    """Named volumes are declared and used; the monitor's --state-file lives on one, in the directory the Dockerfile gives the image's user; Redis reads the ACL file where it is mounted."""
    data = compose()
    used = {v.split(":")[0] for svc in data["services"].values() for v in svc.get("volumes", []) if not v.startswith(".")}
    assert used == set(data["volumes"])
    monitor = data["services"]["monitor"]
    ctx = daemon("streams-monitor").make_context("streams-monitor", [str(a) for a in monitor["command"][1:]])
    state_dir = str(Path(ctx.params["state_file"]).parent)
    assert any(v.split(":")[1] == state_dir and not v.startswith(".") for v in monitor["volumes"])
    user, _ = image_user()
    assert any(op == "RUN" and f"mkdir -p {state_dir}" in args and f"chown {user} {state_dir}" in args for op, args in dockerfile())
    redis = data["services"]["redis"]
    conf = dict(line.split(None, 1) for line in (COMPOSE / "redis/redis.conf").read_text().splitlines() if line and not line.startswith("#"))
    mounts = {v.split(":")[1]: v.split(":")[0] for v in redis["volumes"]}
    assert mounts[conf["aclfile"]] == "./redis/users.acl"
    assert redis["command"][-1] in mounts and mounts[redis["command"][-1]] == "./redis/redis.conf"


def test_the_acl_file_has_only_user_rules() -> None:
    """Redis refuses to start on an ACL file line that is not a `user` rule (a comment too): every line of users.acl is one."""
    lines = [line for line in (COMPOSE / "redis/users.acl").read_text().splitlines() if line.strip()]
    assert lines and all(line.startswith("user ") for line in lines), lines


def test_redis_health_check_works_with_the_acl_file() -> None:
    """`redis-cli ping` (no user, no password) passes: the default user is on, needs no password and may PING; everything waits for that check."""
    data = compose()
    assert data["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    default = next(line for line in (COMPOSE / "redis/users.acl").read_text().splitlines() if line.startswith("user default "))
    assert " on " in default and " nopass" in default and ("+@all" in default or "+ping" in default)
    assert data["x-app"]["depends_on"]["redis"]["condition"] == "service_healthy"


def test_the_workers_stop_grace_period_outlasts_the_shutdown_timeout() -> None:
    """Compose gives a stopping worker longer than STREAMS_SHUTDOWN_TIMEOUT_SECONDS until it kills it, so its requests in progress are handed back, not left to expire."""
    from streams_sched.config import SETTINGS

    shutdown = next(row.default for row in SETTINGS if row.name == "STREAMS_SHUTDOWN_TIMEOUT_SECONDS")
    grace = compose()["services"]["worker"]["stop_grace_period"]
    assert re.fullmatch(r"\d+s", grace) and int(grace[:-1]) > shutdown + 10
