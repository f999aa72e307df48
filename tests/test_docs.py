"""The docs site (docs/**/*.md) and the README: every code block runs or is checked
against the code, and the site builds with warnings as errors.

- ```python blocks run. A block whose first line is ``# settings.py`` is a Scrapy
  settings module instead: it is executed statement by statement, every setting it
  names must be one Scrapy, streams-sched or a plugin it configures reads, every import
  path in it must load, and streams-sched's own settings must pass StreamsConfig's
  validation. Blocks that name ``redis://localhost:6379/0`` run against a throwaway
  redis-server instead.
- ```sh / ```console blocks: each ``streams-sched``, ``streams-reclaimer``,
  ``streams-monitor``, ``python -m streams_sched.cli``, ``python -m reclaimer`` and
  ``python -m monitor`` command is parsed by the real click command, so an option that
  was renamed or removed fails here; ``REDIS_URL=...`` assignments must be valid URLs;
  paths into the repository (scripts/, bench/, compose/, ...) must exist.
- ```yaml and ```json blocks must parse; ```ini blocks must parse as INI (systemd units).
- ```text blocks are shown, not checked: output, ACL rules, diagrams, URL forms.
- A block without a language fails: every block says which of these it is.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from helpers import find_tool

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LANGUAGES = {"python", "sh", "console", "text", "ini", "yaml", "json"}
LOCAL_REDIS = "redis://localhost:6379/0"
#: the repository's own top-level directories: a token starting with one is a path that must exist
REPO_DIRS = ("scripts/", "bench/", "compose/", "deploy/", "tests/", "docs/", ".ci/", "streams_sched/", "reclaimer/", "monitor/")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    pages = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    return sorted(pages) + [ROOT / "README.md"]


_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def blocks_of(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown file (also those indented in list items)."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        lang = info.split()[0] if info else ""
        if not lang.startswith("{"):  # MyST directives ({toctree}, ...) are not code
            found.append(Block(path, i + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return found


ALL_BLOCKS = [b for p in doc_files() for b in blocks_of(p)]


def _of(*langs: str) -> list[Any]:
    return [pytest.param(b, id=b.id) for b in ALL_BLOCKS if b.lang in langs]


# -- every block is marked ----------------------------------------------------------------


def test_every_code_block_names_a_language_this_test_knows() -> None:
    """A block without a language (or with an unknown one) would go unchecked: each says what it is."""
    bad = [f"{b.id} ({b.lang or 'no language'})" for b in ALL_BLOCKS if b.lang not in LANGUAGES]
    assert not bad, f"mark these blocks with one of {sorted(LANGUAGES)}: {bad}"


def test_the_docs_have_examples_of_each_kind_this_test_checks() -> None:
    """The extraction finds the docs' blocks (a broken fence regex would make every other test vacuous)."""
    langs = {b.lang for b in ALL_BLOCKS}
    assert {"python", "sh", "text"} <= langs
    assert sum(1 for b in ALL_BLOCKS if b.lang == "sh") >= 10


# -- python --------------------------------------------------------------------------------


def _is_settings(block: Block) -> bool:
    first = block.code.lstrip().split("\n", 1)[0]
    return first.startswith("# settings.py")


def _package_sources() -> str:
    """The text of the code that reads settings: streams-sched, its daemons and the plugins the docs configure."""
    import scrapy_playwright
    import scrapy_redis

    roots = [ROOT / "streams_sched", ROOT / "reclaimer", ROOT / "monitor"]
    roots += [Path(scrapy_playwright.__file__).parent, Path(scrapy_redis.__file__).parent]
    return "\n".join(p.read_text(encoding="utf-8") for root in roots for p in root.rglob("*.py"))


_SOURCES: list[str] = []


def _known_setting(name: str) -> bool:
    from scrapy.settings import default_settings

    if hasattr(default_settings, name):
        return True
    if not _SOURCES:
        _SOURCES.append(_package_sources())
    return f'"{name}"' in _SOURCES[0] or f"'{name}'" in _SOURCES[0]


#: settings whose value is an import path (or a dict / list of them) that Scrapy loads
_IMPORT_PATHS = {"SCHEDULER", "DUPEFILTER_CLASS", "DOWNLOAD_HANDLERS", "ITEM_PIPELINES", "STREAMS_REQUEST_CLASSES", "REQUEST_FINGERPRINTER_CLASS"}


def _import_paths(name: str, value: Any) -> list[str]:
    if name not in _IMPORT_PATHS or value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [v for v in (*value.keys(), *value.values()) if isinstance(v, str) and "." in v]
    return [v for v in value if isinstance(v, str)]


def _settings_assignments(code: str) -> list[tuple[str, Any, int]]:
    """Run a settings module one statement at a time; every (name, value, line) it assigns."""
    namespace: dict[str, Any] = {}
    assigned: list[tuple[str, Any, int]] = []
    for node in ast.parse(code).body:
        exec(compile(ast.Module([node], type_ignores=[]), "<settings.py>", "exec"), namespace)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.append((target.id, namespace[target.id], node.lineno))
    return assigned


@pytest.fixture
def target_files_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS files the examples name (/etc/ssl/...) live on the machine the example is for, not here."""
    real = os.path.isfile
    monkeypatch.setattr(os.path, "isfile", lambda p: str(p).startswith("/etc/ssl/") or real(p))


@pytest.mark.parametrize("block", [p for p in _of("python") if _is_settings(p.values[0])])
def test_settings_examples_name_real_settings_with_valid_values(block: Block, target_files_exist: None) -> None:
    """A settings.py example names only settings something reads, its import paths load, and its values pass validation."""
    from scrapy.utils.misc import load_object

    from streams_sched.config import StreamsConfig, validate_redis_url

    assigned = _settings_assignments(block.code)
    assert assigned, "a settings example assigns settings"
    unknown = [name for name, _, _ in assigned if name.isupper() and not _known_setting(name)]
    assert not unknown, f"settings nothing reads (renamed?): {unknown}"
    for name, value, _line in assigned:
        for path in _import_paths(name, value):
            load_object(path)  # raises if the class moved
        if name == "REDIS_URL":
            validate_redis_url(value)
        # each assignment on its own, so a value reassigned later in the block is checked too
        StreamsConfig.from_settings({"REDIS_URL": LOCAL_REDIS, name: value}, spider_name="docs")
    if any(name == "SCHEDULER" for name, _, _ in assigned):
        from streams_sched.scheduler import StreamsScheduler

        assert dict((n, v) for n, v, _ in assigned)["SCHEDULER"] == "streams_sched.scheduler.StreamsScheduler"
        assert load_object("streams_sched.scheduler.StreamsScheduler") is StreamsScheduler


@pytest.mark.parametrize("block", [p for p in _of("python") if not _is_settings(p.values[0])])
def test_python_examples_run(block: Block, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python example runs as written (against a throwaway Redis where it names one)."""
    code = block.code
    if "redis://" in code:
        url = request.getfixturevalue("plain_redis_url")
        code = code.replace(LOCAL_REDIS, url)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, block.id, "exec"), {"__name__": "docs_example"})


# -- sh / console -------------------------------------------------------------------------


def _commands(block: Block) -> list[list[str]]:
    """The block's commands as argument lists: continuations joined, comments dropped, split at && ; |."""
    text = block.code
    if block.lang == "console":
        text = "\n".join(line[2:] for line in text.split("\n") if line.startswith("$ "))
    text = text.replace("\\\n", " ")
    commands: list[list[str]] = []
    for line in text.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in lexer:
            if token in {";", "&&", "||", "|", "&"}:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


def _placeholders_out(args: list[str]) -> list[str]:
    """Usage notation to plain arguments: [--opt X] -> --opt X, ID... -> ID, a bare ... dropped."""
    out = []
    for arg in args:
        arg = arg.strip("[]")
        if arg.endswith("...") and arg != "...":
            arg = arg[:-3]
        if arg and arg != "...":
            out.append(arg)
    return out


def _cli(program: str) -> click.Command:
    if program == "streams-sched":
        from streams_sched.cli import main
    elif program == "streams-reclaimer":
        from reclaimer.__main__ import main
    else:
        from monitor.__main__ import main
    return main


def parse_command(program: str, args: list[str]) -> None:
    """Parse ``args`` with the real command's option parser; raise click.UsageError if the shell's call would not parse.

    Only parsing, as click does it before it converts values or checks required options
    (the docs write NAME, ID, redis://...): an option the command does not have, an option
    without its value, a subcommand that does not exist or an argument left over is an error."""
    command = _cli(program)
    ctx = click.Context(command, info_name=program)
    rest = list(args)
    while True:
        _, rest, _ = command.make_parser(ctx).parse_args(rest)
        if isinstance(command, click.Group):
            if not rest:
                return
            sub = command.get_command(ctx, rest[0])
            if sub is None:
                raise click.UsageError(f"no such command {rest[0]!r}", ctx)
            ctx = click.Context(sub, info_name=rest[0], parent=ctx)
            command, rest = sub, rest[1:]
            continue
        if rest:
            raise click.UsageError(f"unexpected extra arguments {rest!r}", ctx)
        return


def _program(argv: list[str]) -> tuple[str, list[str]] | None:
    """Which of our command lines ``argv`` runs, and its arguments."""
    if argv[0] in {"streams-sched", "streams-reclaimer", "streams-monitor"}:
        return argv[0], argv[1:]
    if argv[0].endswith(("python", "python3")) and argv[1:2] == ["-m"] and len(argv) > 2:
        module = {"streams_sched.cli": "streams-sched", "reclaimer": "streams-reclaimer", "monitor": "streams-monitor"}
        if argv[2] in module:
            return module[argv[2]], argv[3:]
    return None


def _env_assignments(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        name, _, value = argv[0].partition("=")
        env[name] = value
        argv = argv[1:]
    return env, argv


@pytest.mark.parametrize("block", _of("sh", "console"))
def test_shell_examples_parse_with_the_real_command_lines(block: Block, target_files_exist: None) -> None:
    """Each command of a shell example that runs streams-sched or a daemon parses with its real options; REDIS_URLs are valid; repository paths exist."""
    from streams_sched.config import validate_redis_url

    for argv in _commands(block):
        env, argv = _env_assignments(argv)
        if "REDIS_URL" in env:
            validate_redis_url(env["REDIS_URL"])
        if not argv:
            continue
        for token in argv:
            if token.startswith(REPO_DIRS) or token.startswith("./scripts/"):
                path = token.removeprefix("./").split("=", 1)[0]
                if not any(ch in path for ch in "*?{"):
                    assert (ROOT / path).exists(), f"{block.id}: {path} does not exist"
        found = _program(argv)
        if found is None:
            continue
        program, args = found
        try:
            parse_command(program, _placeholders_out(args))
        except click.UsageError as exc:
            pytest.fail(f"{block.id}: `{shlex.join(argv)}` does not parse: {exc.format_message()}")


def test_the_command_parser_refuses_an_option_that_does_not_exist() -> None:
    """The shell check can fail: an unknown option, an unknown subcommand or a stray argument is an error."""
    parse_command("streams-sched", ["status", "-c", "NAME", "--json"])
    parse_command("streams-reclaimer", ["--interval", "5"])
    parse_command("streams-monitor", ["--burst", "--state-file", "x.json"])
    for program, args in [
        ("streams-sched", ["status", "-c", "NAME", "--no-such-option"]),
        ("streams-sched", ["no-such-command"]),
        ("streams-sched", ["dlq", "no-such-subcommand"]),
        ("streams-sched", ["status", "-c", "NAME", "stray"]),
        ("streams-reclaimer", ["--intervals", "5"]),
        ("streams-monitor", ["--webhook", "x"]),
    ]:
        with pytest.raises(click.UsageError):
            parse_command(program, args)


# -- data blocks ---------------------------------------------------------------------------


def test_data_examples_parse() -> None:
    """YAML examples are valid YAML, JSON examples valid JSON, INI examples (systemd units) valid INI."""
    checked = 0
    for block in ALL_BLOCKS:
        try:
            if block.lang == "yaml":
                yaml.safe_load(block.code)
            elif block.lang == "json":
                json.loads(block.code)
            elif block.lang == "ini":
                configparser.ConfigParser(strict=False, interpolation=None).read_string(block.code)
            else:
                continue
        except Exception as exc:
            pytest.fail(f"{block.id}: {exc}")
        checked += 1
    assert checked, "the docs have yaml, json or ini examples"


# -- pages ---------------------------------------------------------------------------------


def test_readme_is_a_landing_page_that_opens_with_the_quick_start() -> None:
    """The README stays short and opens with the demo and test commands."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.split("\n")
    assert len(lines) <= 200 + 1, f"README.md has {len(lines)} lines"
    assert lines[0] == "# streams-sched"
    assert lines[2] == "```sh"
    assert lines[3].startswith("./scripts/demo.sh ")
    assert lines[4].startswith("./scripts/test.sh ")
    assert "./scripts/docs.sh" in text


def test_relative_links_of_the_readme_and_the_pages_resolve() -> None:
    """Every relative link (README into docs/, pages to files outside docs/) names a file that exists, so they work on GitHub too."""
    missing = []
    for path in doc_files():
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    assert not missing, missing


def test_the_exit_code_page_names_every_exit_code() -> None:
    """docs/reference/exit-codes.md has one row per code of streams_sched.exit_codes, with its meaning."""
    from streams_sched.exit_codes import EXIT_CODES

    page = (DOCS / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    for code, meaning in EXIT_CODES.items():
        assert f"| `{code}` | {meaning} |" in page


@pytest.mark.e2e
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """sphinx-build -W --keep-going builds the whole site: no broken reference, no page outside a toctree."""
    try:
        import furo  # noqa: F401
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the docs extra is not installed ({exc}; CI is set, so this is an error, not a skip)")
        pytest.skip(f"the docs extra is not installed ({exc}): pip install -e '.[docs]'")
    find_tool("dot", "apt-get install graphviz: sphinx.ext.graphviz draws docs/diagrams/*.dot with it")
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "html" / "index.html").exists()


def test_the_development_page_names_every_module_of_the_package() -> None:
    """Every module of streams_sched, reclaimer and monitor is named on the development page, and every path it names exists."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    missing = []
    for top in ("streams_sched", "reclaimer", "monitor"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py"):
                continue
            if path.parent.name == "cli" or path.parent.name == "demo" and path.name != "serving.py":
                continue  # the command line and the demo are named as folders: one module per topic
            if f"`{path.name}`" not in page:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"name these on docs/development.md (The package is organised by role): {missing}"
    for named in re.findall(r"`((?:worker|frontier|wire|politeness|scrapy_redis|admin|connect|service)/[\w/]+\.(?:py|lua))`", page):
        assert (ROOT / "streams_sched" / named).exists(), f"docs/development.md names {named}, which does not exist"
