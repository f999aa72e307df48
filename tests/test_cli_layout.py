"""The layout of the streams_sched.cli package: topic modules that do not lean on each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import streams_sched.cli
from streams_sched.cli import main

CLI = Path(streams_sched.cli.__file__).parent
#: modules every command module may import; the others are command modules
SHARED = {"options", "formatting", "report"}


def cli_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported from, names) of every ``from X import ...`` of one file, X resolved to
    a name inside the package (``streams_sched.cli.options`` -> ``options``) or kept whole."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level == 1:
                if node.module:
                    out.append((node.module, names))
                else:
                    out += [(n, []) for n in names]
            elif node.level == 2:
                out.append((f"streams_sched.{node.module}", names))
            else:
                out.append((node.module or "", names))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def test_command_modules_import_only_the_shared_modules_and_no_private_names() -> None:
    """No command module imports another, no private name crosses a module, and no module
    of the CLI imports daemon.py."""
    modules = {p.stem for p in CLI.glob("*.py")} - {"__init__", "__main__"}
    commands = modules - SHARED
    assert commands, "no command modules found"
    for path in CLI.glob("*.py"):
        for module, names in cli_imports(path):
            if path.stem not in ("__init__", "__main__"):
                assert module not in commands, f"{path.name} imports the command module {module}"
            assert not any(n.startswith("_") for n in names), f"{path.name} imports private {names} from {module}"
            assert module.split(".")[-1] != "daemon", f"{path.name} imports {module}"
    assert not (CLI.parent / "cli_ops.py").exists()


def test_every_command_module_registers_its_commands() -> None:
    """The group lists every command of the CLI, each from the module of its topic."""
    assert sorted(main.commands) == [
        "crawls", "dlq", "dump", "load", "migrate-scrapy-redis", "move", "nodes", "pause", "purge", "push", "resume", "revisits",
        "site", "status", "url", "watch",
    ]
    assert sorted(main.commands["site"].commands) == ["set", "show"]  # type: ignore[attr-defined]
    assert sorted(main.commands["dlq"].commands) == ["list", "purge", "requeue"]  # type: ignore[attr-defined]


@pytest.mark.e2e
def test_python_m_lists_the_same_commands_as_the_entry_point() -> None:
    """``python -m streams_sched.cli`` is the same command line as ``streams-sched`` (it once
    lost the commands registered by a second module)."""
    out = subprocess.run([sys.executable, "-m", "streams_sched.cli", "--help"], capture_output=True, text=True, check=True).stdout
    listed = [line.split()[0] for line in out.split("Commands:\n", 1)[1].splitlines() if line.strip()]
    assert listed == sorted(main.commands)
    res = subprocess.run([sys.executable, "-m", "streams_sched.cli", "watch", "--help"], capture_output=True, text=True)
    assert res.returncode == 0 and "--until-drained" in res.stdout


@pytest.mark.e2e
def test_loading_the_cli_loads_neither_daemon_nor_migrate() -> None:
    """The CLI loads without daemon.py, and without migrate.py (pickle) or Scrapy until a command that needs them runs."""
    probe = "import sys, streams_sched.cli; print(sorted(m for m in ('streams_sched.service.daemon', 'streams_sched.scrapy_redis.migrate', 'scrapy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
