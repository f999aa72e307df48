"""The Python<->Lua contract: stream codes and each script's KEYS agree on both sides."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from streams_sched.frontier import keys
from streams_sched.frontier.client import NO_MASK
from streams_sched.frontier.keys import BANDS, SITE_TASK, STREAMS, CrawlKeys, ShardKeys, SiteKeys
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import SCRIPT_NAMES, TABLE, read_lua

from helpers import frontier, queued

ROOT = Path(__file__).resolve().parent.parent
STREAM_NAMES = " ".join(f"{t}:{b}" for t, b in STREAMS)
KEYS_LINE = re.compile(r"^-- KEYS\[(\d+)(?:\.\.(\d*))?\]\s+(shard stats|per site, [^:]*:|[\w:]+)")
#: a line of a per-site key group: a role (and how many keys it is), indented under the row
GROUP_LINE = re.compile(r"^--(\s+)([a-z][\w:]*)(?: \((\d+)\))?(?:\s|$)")


def lua_constants() -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^local (\w+) = (\d+)$", read_lua("lib/codes.lua"), re.M)}


def header(name: str) -> str:
    """The leading comment block of ``lua/<name>.lua``."""
    lines = []
    for line in read_lua(f"{name}.lua").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_lua_stream_codes_match_python() -> None:
    """lib/codes.lua's constants are the ones keys.py derives from STREAMS, BANDS and SITE_TASK."""
    assert lua_constants() == {"STREAM_COUNT": len(STREAMS), "BANDS": len(BANDS), "SITE_TASK": SITE_TASK,
                               "DEAD_CODE": keys.stream_code(keys.DEAD_LETTER) - keys.stream_code(0), "SEEN_CODE": keys.stream_code(keys.SEEN_ONLY)}
    assert keys.stream_code(keys.DEAD_LETTER + len(STREAMS) - 1) < keys.stream_code(keys.SEEN_ONLY)
    assert STREAM_NAMES in read_lua("lib/codes.lua")
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


def key_rows(text: str) -> list[tuple[int, str, str, list[tuple[str, int]]]]:
    """A header's KEYS rows: (first index, last index or '' for "to the end" or '-' for one
    key, role, the group's rows) where a row "KEYS[n..] per site, N keys:" is followed by
    the keys each site repeats, one role a line, as (role, count): ``streams (6)`` says
    how many keys the role is, 0 when the line does not say."""
    rows: list[tuple[int, str, str, list[tuple[str, int]]]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = KEYS_LINE.match(line)
        if not m:
            continue
        first, last, rest = int(m[1]), m[2], m[3]
        if last is None:
            last = "-"
        if rest.startswith("per site"):
            group: list[tuple[str, int]] = []
            indent = None
            for more in lines[i + 1 :]:
                g = GROUP_LINE.match(more)
                if not g or (indent is not None and len(g[1]) > indent):
                    if g is None:
                        break
                    continue  # a role's description goes on
                indent = len(g[1]) if indent is None else indent
                group.append((g[2], int(g[3]) if g[3] else 0))
            rows.append((first, last, rest, group))
        else:
            rows.append((first, last, rest, []))
    return rows


def site_roles(k: SiteKeys, filters: list[str]) -> dict[str, list[str]]:
    return {"delayed": [k.delayed], "dlq": [k.dlq], "stats": [k.stats], "policy": [k.policy], "window": [k.window],
            "streams": list(k.streams), "pairs": filters, "filters": filters}


def crawl_roles(k: CrawlKeys) -> dict[str, list[str]]:
    """The keys of a script that serves the crawl, not its sites (heartbeat.lua)."""
    return {"nodes": [k.nodes]}


def shard_roles(ix: ShardKeys) -> dict[str, list[str]]:
    return {"ready:http": [ix.ready("http")], "ready:browser": [ix.ready("browser")], "leased": [ix.leased],
            "inbox": [ix.inbox], "sites": [ix.sites], "shard stats": [ix.stats],
            "fresh:http": [ix.freshes[0]], "fresh:browser": [ix.freshes[1]], "journal": [ix.journal],
            "halt": [ix.halt]}


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_keys_builder_mirrors_the_script_header(name: str) -> None:
    """Each script's KEYS builder puts every key where the script's header says it is; in a
    script that serves several sites of a shard, each site's keys repeat as the header's
    per-site group says, as many as it counts; a script of the crawl's own keys takes them
    from the crawl's."""
    shard = ShardKeys("c", 3)
    sites = [SiteKeys("c", "s.test", 3), SiteKeys("c", "t.test", 3)]
    filters = [["F1", "F1:meta", "F2", "F2:meta"], ["G1", "G1:meta", "G2", "G2:meta"]]
    rows = key_rows(header(name))
    assert rows, f"{name}.lua has no KEYS header"
    multi = any(group for _, _, _, group in rows)
    crawl_level = all(role in crawl_roles(CrawlKeys("c")) for _, _, role, _ in rows)
    builder = TABLE[name].keys
    if name == "enqueue":
        built = builder(shard, list(zip(sites, filters, strict=True)))
    elif name == "seen":  # one site's filter pairs, however many
        sites, filters = sites[:1], filters[:1]
        built = builder(sites[0], filters[0])
    elif crawl_level:
        built = builder(CrawlKeys("c"))
    elif multi:
        built = builder(shard, sites)
    else:
        sites, filters = sites[:1], filters[:1]
        built = builder(sites[0])
    expected: list[str] = []
    for first, last, role, group in rows:
        assert first == len(expected) + 1, f"{name}.lua: KEYS[{first}] does not follow KEYS[{len(expected)}]"
        if group:
            assert last == "" and (first, last, role) == rows[-1][:3], f"{name}.lua: the per-site group comes last"
            counted = re.fullmatch(r"per site, (\d+)(?: \+ 2 \* ARGV\[\d+\])? keys(?: \(\+1 \w+, [^)]*\))?:", role)
            assert counted, f"{name}.lua: KEYS[{first}..] {role}"
            sized = site_roles(sites[0], filters[0])
            unknown = [r for r, _ in group if r not in sized]
            assert not unknown, f"{name}.lua: the per-site group has unknown roles {unknown}"
            fixed = sum(n or len(sized[r]) for r, n in group if r not in ("filters", "pairs"))
            assert fixed == int(counted[1]), f"{name}.lua: the per-site group lists {fixed} keys, says {counted[1]}"
            assert ("ARGV" in role) == any(r in ("filters", "pairs") for r, _ in group), f"{name}.lua: {role}"
            for k, f in zip(sites, filters, strict=True):
                roles = site_roles(k, f)
                for r, n in group:
                    assert r in ("filters", "pairs") or n in (0, len(roles[r])), f"{name}.lua: {r} ({n})"
                    expected += roles[r]
            continue
        roles = {**site_roles(sites[0], filters[0]), **(shard_roles(shard) if multi else shard_roles(sites[0].index)),
                 **crawl_roles(CrawlKeys("c"))}
        assert role in roles, f"{name}.lua: KEYS[{first}] has the unknown role {role!r}"
        want = roles[role]
        if last not in ("", "-"):  # KEYS[a..b]: exactly the role's keys
            assert int(last) - first + 1 == len(want), f"{name}.lua: KEYS[{first}..{last}] {role}"
        elif last == "" and role in ("filters", "pairs"):  # KEYS[a..]: a site's filter pairs, to the end
            assert (first, last, role) == rows[-1][:3], f"{name}.lua: the filter pairs come last"
        else:
            assert len(want) == 1, f"{name}.lua: KEYS[{first}] names one key, {role} is {len(want)}"
        expected += want
    assert built == expected
    if any(r == "streams" for _, _, r, _ in rows) or any(r == "streams" for *_, g in rows for r, _ in g):
        assert STREAM_NAMES in header(name), f"{name}.lua names its streams in another order"


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_stream_codes_in_script_headers(name: str) -> None:
    """Every header that names stream codes gives the range keys.py sends."""
    text = header(name)
    for first, last in re.findall(r"stream (?:index|code)\s+\((\d+)-(\d+)", text):
        assert (int(first), int(last)) == (keys.stream_code(0), keys.stream_code(len(STREAMS) - 1))
    for first, last in re.findall(r"(\d+)-(\d+) = band", text):
        assert (int(first), int(last)) == (keys.stream_code(SITE_TASK), keys.stream_code(SITE_TASK + len(BANDS) - 1))


#: where a script may be registered, or called other than through a module's Call
SCRIPT_HOME = "streams_sched/frontier/scripts/"
#: seeding/ packs enqueue.lua calls as Redis protocol itself, keys and ARGV head from
#: scripts/enqueue.py, on the one path where redis-py's packing costs more than the call
#: (a million seeds)
PACKED_CALLERS = {"streams_sched/frontier/seeding/packing.py", "streams_sched/frontier/seeding/send.py"}


def test_scripts_run_only_through_their_modules() -> None:
    """No module outside scripts/ registers a script or sends EVALSHA itself: every call is
    a Call a script's module builds (the Seeder's packed calls aside)."""
    pattern = re.compile(r"register_script|\.evalsha|execute_command\(\s*\"EVALSHA|\.scripts\[")
    offenders = []
    for folder in ("streams_sched", "reclaimer", "monitor"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SCRIPT_HOME) or rel in PACKED_CALLERS:
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_every_script_has_a_module_and_a_table_line() -> None:
    """Each lua/*.lua script has its module in scripts/ and its line in TABLE, and the
    other way round; each module has its KEYS builder, ARGV builder, parser and call."""
    lua = {p.stem for p in (ROOT / "streams_sched/frontier/lua").glob("*.lua")}
    modules = {p.stem for p in (ROOT / SCRIPT_HOME).glob("*.py") if not p.stem.startswith("_")}
    assert lua == modules == set(TABLE)
    for name, module in TABLE.items():
        assert module.__name__.rsplit(".", 1)[1] == name
        for part in ("keys", "args", "parse", "call"):
            assert callable(getattr(module, part, None)), f"scripts/{name}.py has no {part}()"


@pytest.mark.cluster
def test_site_task_code_routes_by_the_site_policy(redis_url: str, dedupe: str, crawl: str) -> None:
    """A request enqueued with SITE_TASK + band lands in the band's stream of the policy's task type."""
    f = frontier(redis_url, crawl, dedupe)
    from streams_sched.politeness.policy import set_policy

    set_policy(f, "b.test", {"task_type": "browser"})
    items = []
    for band in range(len(BANDS)):
        fp = hashlib.sha1(str(band).encode()).digest()
        items.append(Entry(fp, keys.stream_for(None, band), 0, b"p%d" % band))
    items.append(Entry(b"", keys.stream_for("http", 2), 0, b"explicit"))
    assert f.enqueue("b.test", items)[0] == len(BANDS) + 1
    lengths = {(t, b): len(queued(f, "b.test", t, b)) for t, b in STREAMS}  # inbox or stream
    assert lengths == {s: (1 if s[0] == "browser" or s == ("http", "low") else 0) for s in STREAMS}
    reply = f.lease("b.test", "n1", 10, [1, 1, 1], max_browser=10)
    got = sorted((STREAMS[e.stream], e.payload) for e in reply.entries)
    assert got == sorted([(("browser", b), b"p%d" % n) for n, b in enumerate(BANDS)] + [(("http", "low"), b"explicit")])


def test_default_policy_fields_are_lease_argv_order() -> None:
    """The crawl's default policy goes to lease.lua where its header says, in the order it names, as policy fields."""
    import redis

    from streams_sched.frontier.client import DEFAULT_POLICY_FIELDS, Frontier
    from streams_sched.frontier.scripts import lease
    from streams_sched.politeness.policy import POLICY_FIELDS

    assert set(DEFAULT_POLICY_FIELDS) <= set(POLICY_FIELDS)
    named = re.search(r"ARGV\[(\d+)\.\.(\d+)\]\s+the crawl's defaults.*\n--\s+(.*)", header("lease"))
    assert named is not None
    first, last = int(named[1]), int(named[2])
    assert [w.split(" ")[0] for w in named[3].split(", ")] == list(DEFAULT_POLICY_FIELDS)
    assert last - first + 1 == len(DEFAULT_POLICY_FIELDS)

    class Recorder:
        def execute_command(self, *command: object) -> None:
            self.command = command

    f = Frontier(redis.Redis(), "c", shards=4)  # (registering scripts needs no server)
    f.default_policy = tuple(f"<{name}>" for name in DEFAULT_POLICY_FIELDS)
    pipe = Recorder()
    lease.call(f, 0, "n1", [("s.test", 1, 1, 0)], (1, 1, 1)).queue(pipe)  # type: ignore[arg-type]
    n_keys = int(pipe.command[2])  # EVALSHA sha numkeys keys... args...
    argv = pipe.command[3 + n_keys :]
    assert list(argv[first - 1 : last]) == list(f.default_policy)


@pytest.mark.cluster
def test_crawl_default_policy_reaches_lease(redis_url: str, dedupe: str, crawl: str) -> None:
    """A "*" policy stored by set_policy and taken with use_crawl_defaults pauses an unlisted site."""
    from streams_sched.frontier.replies import text
    from streams_sched.politeness.policy import set_policy

    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("u.test", [Entry(b"", 0, 0, b"p")])
    set_policy(f, "*", {"paused": True, "task_type": "browser", "rate": 3})
    meta = {text(k): text(v) for k, v in f.client.hgetall(f.keys.meta).items()}
    f.use_crawl_defaults(meta)
    assert f.default_task == "browser"
    assert float(f.default_policy[0]) == 3.0
    reply = f.lease("u.test", "n1", 5, [1, 1, 1])
    assert reply.wait_ms == -1 and reply.entries == []
    f.use_crawl_defaults({})
    assert f.lease("u.test", "n1", 5, [1, 1, 1]).entries[0].payload == b"p"
