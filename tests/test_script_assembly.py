"""scripts.assemble: each script carries the helpers it uses and no others."""

from __future__ import annotations

import re

import pytest

from streams_sched.frontier import scripts
from streams_sched.frontier.scripts import SCRIPT_NAMES, _chunks, _without_comments, assemble

LIB = scripts._LIB
HELPERS = {name for names, _ in _chunks(LIB) for name in names}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_every_helper_a_script_uses_is_defined_before_it(name: str) -> None:
    """A script's text defines every shared helper it names, before the script body."""
    src = scripts.source(name)
    code = _without_comments(src)
    used = {n for n in re.findall(r"[A-Za-z_]\w*", code) if n in HELPERS}
    for helper in used:
        assert re.search(rf"^local (function )?{helper}\b", src, re.M), (name, helper)


def test_scripts_without_dedupe_leave_the_bloom_code_out() -> None:
    """ack, lease and feedback do not define the Bloom filter helpers; enqueue does."""
    for name in ("ack", "lease", "feedback", "status"):
        assert "bloom_bitmap" not in scripts.source(name), name
    assert "local function bloom_bitmap" in scripts.source("enqueue")


def test_helpers_reached_only_through_other_helpers_are_included() -> None:
    """A helper used only by another helper comes along (dedupe -> seen_in -> exact_has)."""
    src = assemble(LIB, "return dedupe('bf', {}, {}, 0.001, 10, 2)")
    for helper in ("seen_in", "exact_has", "filter_form", "bloom_of", "bloom_bf", "u32", "BITS8"):
        assert re.search(rf"^local (function )?{helper}\b", src, re.M), helper
    assert "retire_if_empty" not in src
