"""The shape of the code: short modules, functions and classes, packages that say what
they own, and comments that say why rather than which issue asked for it."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("streams_sched", "reclaimer", "monitor")

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_CLASS_ATTRIBUTES = 20

#: What may be over a limit, and why: a module by its path, a function or class by
#: ``path::Qualname``. Each entry must still be over its limit (a stale one fails).
EXCEPTIONS: dict[str, str] = {
    "streams_sched/worker/scheduler.py": (
        "Scrapy's scheduler interface: enqueue_request, next_request and request_done run for"
        " every request on the reactor thread, so their steps stay inline; the parts they use"
        " are modules of their own (ready, answers, dedupe, counters, opening, handback, turns)"
    ),
    "streams_sched/config.py": "the settings table, one row per setting, is the one source and reads whole",
    "streams_sched/config.py::StreamsConfig": "one field per row of the settings table",
    "streams_sched/worker/exchange.py::Exchange": (
        "the one object both threads share: each field is one attribute read on a hot path"
    ),
    "monitor/settings.py::MonitorSettings": "one field per command-line option, read as one table",
}

#: Files that may name an issue number, and why.
ISSUE_REFERENCES_ALLOWED: dict[str, str] = {}
#: history files, where issue numbers belong
ISSUE_REFERENCES_HOME = {"CHANGELOG.md", "bench/RESULTS.md"}
ISSUE_SUFFIXES = (".py", ".lua", ".sh", ".toml", ".md")
SKIPPED_DIRS = {".venv", ".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
# "issue" then a number, with a space, a hyphen or "#" between, or none; "issues" too
ISSUE_NUMBER = re.compile(r"\bissues?[ -]?#?\d", re.IGNORECASE)


def _modules() -> Iterator[tuple[str, ast.Module, int]]:
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            yield path.relative_to(ROOT).as_posix(), ast.parse(source), len(source.splitlines())


def _defs(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """Every function and class under ``node``, with its qualified name."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            yield name, child
            yield from _defs(child, f"{name}.")
        else:
            yield from _defs(child, prefix)


def _attributes(cls: ast.ClassDef) -> set[str]:
    """Annotated class-level fields (dataclass fields) and every ``self.x = ...`` target."""
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def _oversized() -> dict[str, str]:
    """What is over a limit: key as in EXCEPTIONS -> what and by how much."""
    over: dict[str, str] = {}
    for path, tree, lines in _modules():
        if lines > MAX_MODULE_LINES:
            over[path] = f"{lines} lines"
        for name, node in _defs(tree):
            if isinstance(node, ast.ClassDef):
                count = len(_attributes(node))
                if count > MAX_CLASS_ATTRIBUTES:
                    over[f"{path}::{name}"] = f"{count} attributes"
            else:
                assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    over[f"{path}::{name}"] = f"{length} lines"
    return over


def test_modules_functions_and_classes_are_small() -> None:
    """No module over 400 lines, function over 60 lines or class over 20 attributes, but the listed exceptions."""
    over = _oversized()
    unexplained = {key: size for key, size in over.items() if key not in EXCEPTIONS}
    assert not unexplained, f"split these (or list them in EXCEPTIONS with why): {unexplained}"


def test_every_exception_is_still_needed() -> None:
    """Each EXCEPTIONS entry is still over its limit, so the list shrinks as the code does."""
    over = _oversized()
    stale = sorted(key for key in EXCEPTIONS if key not in over)
    assert not stale, f"within the limits now: remove from EXCEPTIONS: {stale}"


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
    "admin": {"(top)", "frontier", "connect", "service"},
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
