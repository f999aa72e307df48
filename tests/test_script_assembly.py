"""How a script's text is put together: the helper files its include line names, in
LIB_ORDER, then its body; and only those."""

from __future__ import annotations

import re

import pytest

from streams_sched.frontier.scripts import SCRIPT_NAMES, read_lua, source
from streams_sched.frontier.scripts._source import LIB_ORDER, includes, lib_needs


def _defined(text: str) -> set[str]:
    """The top-level names a Lua text defines (``local function f`` and ``local X =``)."""
    names: set[str] = set()
    for m in re.finditer(r"^local (?:function (\w+)|([\w, ]+?)\s*=)", text, re.M):
        names |= {m[1]} if m[1] else {n.strip() for n in m[2].split(",")}
    return names


def _code(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


HELPERS = {lib: _defined(read_lua(f"lib/{lib}.lua")) for lib in LIB_ORDER}


def test_lib_order_puts_each_file_after_the_ones_it_needs() -> None:
    """LIB_ORDER is the dependency order, and every helper file says what it needs."""
    for i, lib in enumerate(LIB_ORDER):
        assert set(lib_needs(lib)) <= set(LIB_ORDER[:i]), lib


@pytest.mark.parametrize("lib", LIB_ORDER)
def test_a_helper_file_uses_only_what_it_needs(lib: str) -> None:
    """A helper file names only its own helpers and those of the files on its needs line."""
    allowed = HELPERS[lib].union(*(HELPERS[n] for n in lib_needs(lib)))
    others = set().union(*(HELPERS[n] for n in LIB_ORDER)) - allowed
    used = set(re.findall(r"[A-Za-z_]\w*", _code(read_lua(f"lib/{lib}.lua"))))
    assert used & others == set(), lib


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_includes_what_it_uses_and_nothing_it_does_not(name: str) -> None:
    """Every helper a script names comes from a file it includes, and each file it includes
    is used by it or by another file it includes."""
    body = _code(read_lua(f"{name}.lua"))
    used = set(re.findall(r"[A-Za-z_]\w*", body))
    named = includes(name)
    for lib in LIB_ORDER:
        if lib not in named:
            assert used & HELPERS[lib] == set(), (name, lib)
    needed_by_others = {need for lib in named for need in lib_needs(lib)}
    for lib in named:
        assert used & HELPERS[lib] or lib in needed_by_others, f"{name}.lua includes {lib} without using it"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_text_sent_is_the_included_files_in_order_then_the_body(name: str) -> None:
    """source() joins the included helper files in LIB_ORDER, then the script."""
    text = source(name)
    assert text.endswith(read_lua(f"{name}.lua"))
    at = [text.index(read_lua(f"lib/{lib}.lua")) for lib in LIB_ORDER if lib in includes(name)]
    assert at == sorted(at)


def test_scripts_without_dedupe_leave_the_bloom_code_out() -> None:
    """ack, lease, feedback and status do not define the Bloom filter helpers; enqueue does."""
    for name in ("ack", "lease", "feedback", "status"):
        assert "bloom_bitmap" not in source(name), name
    assert "local function bloom_bitmap" in source("enqueue")
