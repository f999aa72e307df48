"""The settings table (streams_sched.config.SETTINGS) is the one list of settings: every
setting the code reads is in it, documented, and StreamsConfig's defaults are its defaults."""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from streams_sched.config import REQUIRED, SECTIONS, SETTINGS, Lookup, StreamsConfig, settings_markdown

ROOT = Path(__file__).resolve().parent.parent
#: the packages whose sources are scanned for setting names
PACKAGES = ("streams_sched", "reclaimer", "monitor")
NAMES = {row.name for row in SETTINGS}

#: STREAMS_* names that are environment variables of the daemons, not Scrapy settings
#: (the daemons take command-line options, listed by their --help, not a settings table)
ENVIRONMENT_ONLY = {
    "STREAMS_RECLAIMER",  # reclaimer/__main__.py: click's auto_envvar_prefix, STREAMS_RECLAIMER_<OPTION>
    "STREAMS_MONITOR",  # monitor/__main__.py: click's auto_envvar_prefix, STREAMS_MONITOR_<OPTION>
    "STREAMS_WEBHOOK_SECRET",  # monitor/__main__.py: --webhook-secret, kept out of the command line
}

_STREAMS_NAME = re.compile(r"\bSTREAMS_[A-Z0-9_]*[A-Z0-9]")
#: methods of Scrapy's Settings (and of a dict) that read a setting by name
_GETTERS = {"get", "getbool", "getint", "getfloat", "getlist", "getdict", "getdictorlist", "getwithbase", "getpriority"}


def _trees() -> Iterator[tuple[str, ast.AST]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def _literals() -> dict[str, set[str]]:
    """STREAMS_* name -> the files with a string literal (a message or docstring too) naming it."""
    found: dict[str, set[str]] = {}
    for where, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in _STREAMS_NAME.findall(node.value):
                    found.setdefault(name, set()).add(where)
    return found


def _is_environ(node: ast.expr) -> bool:
    """``os.environ`` or ``environ``: environment variables, not settings."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name) and node.id == "environ")


def _read_names(trees: Iterable[tuple[str, ast.AST]]) -> dict[str, set[str]]:
    """STREAMS_* / REDIS_* names read as settings: ``x.get*("NAME")``, ``x["NAME"]``,
    ``getattr(x, "NAME")`` (not ``os.environ``'s) -> the files reading them."""
    found: dict[str, set[str]] = {}
    for where, tree in trees:
        for node in ast.walk(tree):
            key: ast.expr | None = None
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in _GETTERS and not _is_environ(func.value):
                    key = node.args[0]
                elif isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) > 1:
                    key = node.args[1]
            elif isinstance(node, ast.Subscript) and not _is_environ(node.value):
                key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                if re.fullmatch(r"(STREAMS|REDIS)_[A-Z0-9_]+", key.value):
                    found.setdefault(key.value, set()).add(where)
    return found


def test_every_streams_name_in_the_code_is_a_setting_of_the_table() -> None:
    """Every STREAMS_* name in a string of the code is a row of SETTINGS or a listed environment variable."""
    unknown = {name: sorted(files) for name, files in _literals().items() if name not in NAMES | ENVIRONMENT_ONLY}
    assert not unknown, f"add these settings to streams_sched.config.SETTINGS: {unknown}"


def test_the_read_scan_finds_setting_reads() -> None:
    """The scan below sees settings.get*, [...] and getattr reads, and leaves os.environ's out."""
    source = """
settings.getbool("STREAMS_A"); crawler.settings["STREAMS_B"]; getattr(settings, "REDIS_C")
os.environ.get("STREAMS_D"); os.environ["STREAMS_E"]; settings.get("CONCURRENT_REQUESTS")
"""
    assert set(_read_names([("x.py", ast.parse(source))])) == {"STREAMS_A", "STREAMS_B", "REDIS_C"}


def test_every_setting_read_by_name_is_in_the_table() -> None:
    """Every STREAMS_* or REDIS_* name read with settings.get*, [...] or getattr is a row of SETTINGS."""
    reads = _read_names(_trees())
    unknown = {name: sorted(files) for name, files in reads.items() if name not in NAMES | ENVIRONMENT_ONLY}
    assert not unknown, f"add these settings to streams_sched.config.SETTINGS: {unknown}"


def test_environment_only_names_are_still_used_and_not_settings() -> None:
    """The allow-list holds only names the code still uses and that are not settings, so it cannot rot."""
    literals = _literals()
    assert all(name in literals for name in ENVIRONMENT_ONLY), ENVIRONMENT_ONLY - set(literals)
    assert not ENVIRONMENT_ONLY & NAMES


def test_every_setting_has_a_doc_and_a_section() -> None:
    """Each row has a non-empty meaning, a section of the reference, and a unique name."""
    for row in SETTINGS:
        assert row.doc.strip() and row.section in SECTIONS, row.name
        assert row.default_text().strip(), row.name
    assert len(NAMES) == len(SETTINGS)
    assert set(SECTIONS) == {row.section for row in SETTINGS}


def test_streams_config_defaults_are_the_table_defaults() -> None:
    """A StreamsConfig built by hand takes each row's default (a Lookup's ``fixed``; REQUIRED fields must be given)."""
    required = {row.field for row in SETTINGS if isinstance(row.default, Lookup) and row.default.fixed is REQUIRED}
    assert required == {"redis_url", "crawl"}
    cfg = StreamsConfig("redis://localhost:6379/0", "spider")
    first: dict[str, object] = {}
    for row in SETTINGS:
        first.setdefault(row.field, row.default)
    for name, default in first.items():
        if name in required:
            continue
        expected = default.fixed if isinstance(default, Lookup) else default
        assert getattr(cfg, name) == expected, name
    assert {f.name for f in dataclasses.fields(StreamsConfig)} == set(first)


def test_from_settings_fills_lookups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults that are looked up come from the environment, the spider name and scrapy-redis's key."""
    monkeypatch.setenv("REDIS_URL", "redis://envhost:6379/0")
    monkeypatch.setenv("STREAMS_ALLOW_UNTESTED_SCRAPY", "yes")
    cfg = StreamsConfig.from_settings({}, "books")
    assert cfg.redis_url == "redis://envhost:6379/0" and cfg.crawl == "books"
    assert cfg.allow_untested_scrapy is True and cfg.feed_key == "books:start_urls"


def test_first_set_row_of_a_field_wins() -> None:
    """STREAMS_FEED_KEY wins over REDIS_START_URLS_KEY; the second is read when the first is not set."""
    base = {"REDIS_URL": "redis://localhost:6379/0"}
    both = StreamsConfig.from_settings({**base, "STREAMS_FEED_KEY": "a:%(name)s", "REDIS_START_URLS_KEY": "b"}, "s")
    assert both.feed_key == "a:s"
    assert StreamsConfig.from_settings({**base, "REDIS_START_URLS_KEY": "b:%(name)s"}, "s").feed_key == "b:s"


def test_url_shortcut_and_metrics_are_settings() -> None:
    """STREAMS_URL_SHORTCUT and STREAMS_METRICS_PORT/ADDR are parsed into StreamsConfig and checked."""
    base = {"REDIS_URL": "redis://localhost:6379/0"}
    cfg = StreamsConfig.from_settings({**base, "STREAMS_URL_SHORTCUT": "false", "STREAMS_METRICS_PORT": "9410-9411"}, "s")
    assert cfg.url_shortcut is False and cfg.metrics_ports == (9410, 9411) and cfg.metrics_addr == "0.0.0.0"
    assert StreamsConfig.from_settings(base, "s").metrics_ports == ()


def test_markdown_reference_lists_every_setting() -> None:
    """settings_markdown() has a heading per section and a table row per setting with its default."""
    text = settings_markdown()
    for section in SECTIONS:
        assert f"\n## {section}\n" in f"\n{text}"
    for row in SETTINGS:
        line = next((line for line in text.splitlines() if line.startswith(f"| `{row.name}` |")), None)
        assert line is not None, row.name
        assert len(re.findall(r"(?<!\\)\|", line)) == 4, line  # three cells: any "|" in the text is escaped
    assert "| `STREAMS_LEASE_SECONDS` | 300 |" in text
    assert "| `REDIS_URL` | env `REDIS_URL` |" in text


def test_sphinx_directive_renders_every_setting(tmp_path: Path) -> None:
    """docs/reference/settings.md builds warning-free with the streams-settings directive and lists every setting."""
    pytest.importorskip("myst_parser")
    from sphinx.cmd.build import build_main

    source = tmp_path / "src"
    (source / "reference").mkdir(parents=True)
    (source / "reference" / "settings.md").write_text((ROOT / "docs/reference/settings.md").read_text())
    (source / "index.md").write_text("# streams-sched\n\n```{toctree}\nreference/settings\n```\n")
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
        'project = "streams-sched"\nextensions = ["myst_parser", "settings_ref"]\n'
    )
    out = tmp_path / "html"
    assert build_main(["-W", "-q", "-b", "html", str(source), str(out)]) == 0
    page = (out / "reference" / "settings.html").read_text()
    for row in SETTINGS:
        assert f'<span class="pre">{row.name}</span>' in page, row.name
    assert page.count("<h2>") == len(SECTIONS)
