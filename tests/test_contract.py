"""The Python<->Lua contract: stream codes and each script's KEYS agree on both sides."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from streams_sched import keys, script_keys
from streams_sched.frontier import NO_MASK, Outgoing
from streams_sched.keys import BANDS, SITE_TASK, STREAMS, SiteKeys
from streams_sched.scripts import SCRIPT_NAMES, read_lua

from helpers import frontier

ROOT = Path(__file__).resolve().parent.parent
STREAM_NAMES = " ".join(f"{t}:{b}" for t, b in STREAMS)
KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)(?:\.\.(\d*))?\]\s+(\w+)", re.M)


def lua_constants() -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^local (\w+) = (\d+)$", read_lua("_codes.lua"), re.M)}


def header(name: str) -> str:
    """The leading comment block of ``lua/<name>.lua``."""
    lines = []
    for line in read_lua(f"{name}.lua").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_lua_stream_codes_match_python() -> None:
    """_codes.lua's constants are the ones keys.py derives from STREAMS, BANDS and SITE_TASK."""
    assert lua_constants() == {"STREAM_COUNT": len(STREAMS), "BANDS": len(BANDS), "SITE_TASK": SITE_TASK}
    assert STREAM_NAMES in read_lua("_codes.lua")
    assert [keys.stream_code(i) for i in range(len(STREAMS))] == list(range(1, len(STREAMS) + 1))
    assert all(keys.stream_of_code(keys.stream_code(i)) == i for i in range(len(STREAMS)))


def test_stream_for_and_mask_follow_streams_order() -> None:
    """stream_for names the index of (task, band) in STREAMS, or SITE_TASK + band; masks follow STREAMS."""
    for index, (task, band) in enumerate(STREAMS):
        assert keys.stream_for(task, BANDS.index(band)) == index
    assert [keys.stream_for(None, b) for b in range(len(BANDS))] == [SITE_TASK + b for b in range(len(BANDS))]
    assert SITE_TASK >= len(STREAMS)  # a site-task code never names a real stream
    assert NO_MASK == "1" * len(STREAMS)
    assert keys.stream_mask(["browser"]) == "".join("1" if t == "browser" else "0" for t, _ in STREAMS)
    assert keys.BROWSER_FIRST_STREAM == keys.stream_for("browser", 0)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_keys_builder_mirrors_the_script_header(name: str) -> None:
    """Each script's KEYS builder puts every key where the script's header says it is."""
    k = SiteKeys("c", "s.test")
    filters = ["F1", "F1:meta", "F2", "F2:meta"]
    built = script_keys.BUILDERS[name](k, filters) if name == "enqueue" else script_keys.BUILDERS[name](k)
    roles = {"delayed": [k.delayed], "dlq": [k.dlq], "stats": [k.stats], "policy": [k.policy], "obs": [k.obs],
             "streams": list(k.streams), "pairs": filters}
    text = header(name)
    rows = KEYS_LINE.findall(text)
    assert rows, f"{name}.lua has no KEYS header"
    expected: list[str] = []
    for first, last, role in rows:
        assert int(first) == len(expected) + 1, f"{name}.lua: KEYS[{first}] does not follow KEYS[{len(expected)}]"
        want = roles[role]
        if last:  # KEYS[a..b]: exactly the role's keys
            assert int(last) - int(first) + 1 == len(want), f"{name}.lua: KEYS[{first}..{last}] {role}"
        expected += want
    assert built == expected
    if "streams" in [r[2] for r in rows]:
        assert STREAM_NAMES in text, f"{name}.lua names its streams in another order"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_stream_codes_in_script_headers(name: str) -> None:
    """Every header that names stream codes gives the range keys.py sends."""
    text = header(name)
    for first, last in re.findall(r"stream (?:index|code)\s+\((\d+)-(\d+)", text):
        assert (int(first), int(last)) == (keys.stream_code(0), keys.stream_code(len(STREAMS) - 1))
    for first, last in re.findall(r"(\d+)-(\d+) = band", text):
        assert (int(first), int(last)) == (keys.stream_code(SITE_TASK), keys.stream_code(SITE_TASK + len(BANDS) - 1))


def test_only_frontier_calls_scripts() -> None:
    """Scripts run only through Frontier: no other module calls or registers one."""
    pattern = re.compile(r"scripts\.call\(|\.scripts\.(?!load\(\))\w+|register_script|execute_command\(\s*\"EVALSHA")
    offenders = []
    for folder in ("streams_sched", "reclaimer", "monitor"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name in ("frontier.py", "scripts.py"):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


@pytest.mark.cluster
def test_site_task_code_routes_by_the_site_policy(redis_url: str, dedupe: str, crawl: str) -> None:
    """A request enqueued with SITE_TASK + band lands in the band's stream of the policy's task type."""
    f = frontier(redis_url, crawl, dedupe)
    f.client.hset(f.site("b.test").policy, "task_type", "browser")
    items = []
    for band in range(len(BANDS)):
        fp = hashlib.sha1(str(band).encode()).digest()
        items.append(Outgoing(fp, keys.stream_for(None, band), 0, b"p%d" % band))
    items.append(Outgoing(b"", keys.stream_for("http", 2), 0, b"explicit"))
    assert f.enqueue("b.test", items)[0] == len(BANDS) + 1
    k = f.site("b.test")
    lengths = {STREAMS[i]: int(f.client.xlen(key)) for i, key in enumerate(k.streams)}
    assert lengths == {s: (1 if s[0] == "browser" or s == ("http", "low") else 0) for s in STREAMS}
    reply = f.lease("b.test", "n1", 10, [1, 1, 1], max_browser=10)
    got = sorted((STREAMS[e.stream], e.payload) for e in reply.entries)
    assert got == sorted([(("browser", b), b"p%d" % n) for n, b in enumerate(BANDS)] + [(("http", "low"), b"explicit")])


def test_default_policy_fields_are_lease_argv_order() -> None:
    """The crawl's default policy goes to lease.lua in the order its header names, as policy fields."""
    from streams_sched.frontier import DEFAULT_POLICY_FIELDS
    from streams_sched.policy import POLICY_FIELDS

    assert set(DEFAULT_POLICY_FIELDS) <= set(POLICY_FIELDS)
    named = re.search(r"ARGV\[11\.\.15\].*\n--\s+(.*)", header("lease"))
    assert named is not None
    assert [w.split(" ")[0] for w in named[1].split(", ")] == list(DEFAULT_POLICY_FIELDS)


@pytest.mark.cluster
def test_crawl_default_policy_reaches_lease(redis_url: str, dedupe: str, crawl: str) -> None:
    """A "*" policy stored by set_policy and taken with use_crawl_defaults pauses an unlisted site."""
    from streams_sched.policy import set_policy
    from streams_sched.replies import text

    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("u.test", [Outgoing(b"", 0, 0, b"p")])
    set_policy(f, "*", {"paused": True, "task_type": "browser", "rate": 3})
    meta = {text(k): text(v) for k, v in f.client.hgetall(f.keys.meta).items()}
    f.use_crawl_defaults(meta)
    assert f.default_task == "browser"
    assert float(f.default_policy[0]) == 3.0
    reply = f.lease("u.test", "n1", 5, [1, 1, 1])
    assert reply.wait_ms == -1 and reply.entries == []
    f.use_crawl_defaults({})
    assert f.lease("u.test", "n1", 5, [1, 1, 1]).entries[0].payload == b"p"
