"""The shape of the code: packages that say what they own, and comments that say why
rather than which issue asked for it. Code is split by thread and job, not by a count of
lines or attributes, so no size is checked here."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Files that may name an issue number, and why.
ISSUE_REFERENCES_ALLOWED: dict[str, str] = {}
#: history files, where issue numbers belong
ISSUE_REFERENCES_HOME = {"CHANGELOG.md", "bench/RESULTS.md"}
ISSUE_SUFFIXES = (".py", ".lua", ".sh", ".toml", ".md")
SKIPPED_DIRS = {".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
# "issue" then a number, with a space, a hyphen or "#" between, or none; "issues" too
ISSUE_NUMBER = re.compile(r"\bissues?[ -]?#?\d", re.IGNORECASE)


def test_every_subpackage_says_what_it_owns() -> None:
    """Every package under streams_sched/ has a module docstring in its __init__.py."""
    missing = []
    for init in sorted((ROOT / "streams_sched").rglob("__init__.py")):
        if not (ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or "").strip():
            missing.append(init.relative_to(ROOT).as_posix())
    assert not missing, f"packages without a docstring: {missing}"


def _text_files() -> Iterator[str]:
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        dirs[:] = [
            d for d in dirs
            if d not in SKIPPED_DIRS and not d.startswith(".venv") and not d.endswith(".egg-info") and (d if rel == "." else f"{rel}/{d}") != "docs/_build"
        ]
        for name in files:
            if name.endswith(ISSUE_SUFFIXES):
                yield (Path(folder) / name).relative_to(ROOT).as_posix()


def test_no_issue_numbers_outside_the_history() -> None:
    """No "issue <number>" in code, scripts, settings or docs: they state the rule or the reason instead."""
    found = []
    for path in _text_files():
        if path in ISSUE_REFERENCES_HOME or path in ISSUE_REFERENCES_ALLOWED:
            continue
        for number, line in enumerate((ROOT / path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if ISSUE_NUMBER.search(line):
                found.append(f"{path}:{number}: {line.strip()[:100]}")
    assert not found, "say the rule or reason instead of the issue number:\n" + "\n".join(found)


#: What each subpackage may import of the others, as its docstring says ("(top)": the
#: top-level modules, config, errors and the like). cli/ and demo/ sit on top of all.
IMPORT_RULES: dict[str, set[str]] = {
    "wire": {"(top)"},
    "connect": {"(top)"},
    "frontier": {"(top)", "wire", "connect", "scrapy_redis"},
    "politeness": {"(top)", "frontier"},
    "scrapy_redis": {"(top)", "frontier", "wire"},
    "admin": {"(top)", "frontier", "connect"},
    "service": {"(top)", "frontier", "connect"},
    "worker.io": {"(top)", "worker", "wire", "frontier", "connect", "politeness", "scrapy_redis"},
    "worker": {"(top)", "worker.io", "wire", "frontier", "connect", "politeness", "scrapy_redis", "admin", "service"},
}
TOP_LEVEL = {"config", "errors", "exit_codes", "testing", "scheduler", "settings_parse"}


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "streams_sched":
        return None
    if len(parts) == 1 or parts[1] in TOP_LEVEL:
        return "(top)"
    if parts[1] == "worker" and len(parts) > 2 and parts[2] == "io":
        return "worker.io"
    return parts[1]


def test_subpackages_import_only_what_their_docstrings_allow() -> None:
    """No subpackage imports one its docstring does not allow (IMPORT_RULES), so the layers stay as the tree shows them."""
    broken = []
    for path in sorted((ROOT / "streams_sched").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mine = _package_of(module)
        if mine not in IMPORT_RULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                target = _package_of(node.module)
                if target is not None and target != mine and target not in IMPORT_RULES[mine]:
                    broken.append(f"{path.relative_to(ROOT)}:{node.lineno} ({mine}) imports {node.module} ({target})")
    assert not broken, "\n".join(broken)


#: names that end in _seconds because something outside the code names them so: command-line
#: options of the daemons (--cache-seconds, --dlq-quiet-seconds: click names the parameter
#: after the option)
SECONDS_NAMES_FROM_OPTIONS = {"cache_seconds", "dlq_quiet_seconds", "scale_horizon_seconds"}


def test_seconds_are_spelled_s_in_code_and_seconds_only_where_settings_name_them() -> None:
    """A duration in code ends in _s (or _ms); _seconds only on StreamsConfig fields, which mirror the STREAMS_*_SECONDS settings, and on parameters click names after a --*-seconds option."""
    import dataclasses

    from streams_sched.config import StreamsConfig

    fields = {f.name for f in dataclasses.fields(StreamsConfig)}
    found = []
    for folder in ("streams_sched", "reclaimer", "monitor"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                name = None
                if isinstance(node, ast.Attribute):
                    name = node.attr
                elif isinstance(node, ast.Name):
                    name = node.id
                elif isinstance(node, ast.arg):
                    name = node.arg
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    name = node.name
                elif isinstance(node, ast.keyword):
                    name = node.arg
                if name and name.endswith(("_seconds", "_secs", "_sec")) and name not in fields | SECONDS_NAMES_FROM_OPTIONS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")  # type: ignore[attr-defined]
    assert not found, "spell these _s (seconds) or _ms:\n" + "\n".join(sorted(set(found)))
