"""Security: ACL users with only their role's rules, AUTH in the URL, TLS, and no code from the queue."""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis_tools import make_tls_files

from streams_sched.admin import acl
from streams_sched.connect.clients import connect, connect_ready
from streams_sched.demo.web import SyntheticWeb
from streams_sched.errors import RedisUnavailable
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.testing import RedisServer, TlsFiles

from helpers import Worker, base_settings, crawl_to_end, crawled_urls, frontier, missing, wait_for, with_user

PACKAGE = Path(__file__).resolve().parent.parent / "streams_sched"


@pytest.mark.e2e
@pytest.mark.cluster
def test_worker_runs_with_only_its_acl_rules(redis_url: str, target: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """A worker whose ACL user has only the worker rules of its crawl crawls everything, denied nothing."""
    admin = connect(redis_url)
    admin.execute_command("ACL LOG", "RESET", **({"target_nodes": "all"} if target == "cluster" else {}))
    applied = acl.setuser(admin, "worker", "w-secret", "worker", crawl)
    assert "+@all" not in applied and f"~ss:{{{crawl}/*" in applied
    try:
        items = tmp_path / "items.jsonl"
        url = with_user(redis_url, "worker", "w-secret")
        w = Worker(base_settings(url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=60), tmp_path / "w.log")
        crawl_to_end(w)
        assert set(crawled_urls(items)) == SyntheticWeb(sites=2, pages=60).all_urls()
        assert acl.denials(admin, "worker") == []
        assert "w-secret" not in w.log()  # the URL is logged redacted
    finally:
        acl.deluser(admin, "worker")


def test_worker_acl_user_cannot_touch_another_crawl(plain_redis_url: str, crawl: str) -> None:
    """The worker rules of one crawl give no access to another crawl's keys or events."""
    admin = connect(plain_redis_url)
    acl.setuser(admin, "worker", "pw", "worker", crawl)
    try:
        mine = connect(with_user(plain_redis_url, "worker", "pw"))
        mine.xadd(Frontier(admin, crawl).site("a.test").stream("http", "default"), {"r": b"x"})
        other = "other-" + crawl
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.xadd(Frontier(admin, other).site("a.test").stream("http", "default"), {"r": b"x"})
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.hgetall(CrawlKeys(other).nodes)
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.publish(CrawlKeys(other).events, "x")
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.flushall()
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.execute_command("EVAL", "return 1", 0)  # only known scripts, by SHA
    finally:
        acl.deluser(admin, "worker")


def test_monitor_rules_are_read_only(plain_redis_url: str, crawl: str) -> None:
    """The monitor rules read a site's status and the node records but write nothing."""
    f = frontier(plain_redis_url, crawl)
    f.scripts.load()
    f.enqueue("a.test", [])
    admin = f.client
    acl.setuser(admin, "monitor", "pw", "monitor")
    try:
        ro = connect(with_user(plain_redis_url, "monitor", "pw"))
        assert f.status("a.test", client=ro).backlog == 0
        ro.hgetall(CrawlKeys(crawl).nodes)
        for write in (
            lambda: ro.xadd(f.site("a.test").stream("http", "high"), {"r": "x"}),
            lambda: ro.hset(CrawlKeys(crawl).nodes, "n", "x"),
            lambda: ro.evalsha(f.scripts["ack"].sha, 0),
            lambda: ro.script_load("return 1"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                write()
    finally:
        acl.deluser(admin, "monitor")


#: Modules whose import alone is a way to run code from data.
BANNED_MODULES = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle", "runpy", "imp", "pydoc"}
#: Callables that evaluate text or import a module named by a string...
BANNED_CALLS = {"eval", "exec", "__import__", "compile", "load_object", "import_module", "locate"}
#: ... and those called as attributes (``re.compile`` is fine, ``builtins.eval`` is not).
BANNED_METHODS = {"__import__", "load_object", "import_module", "locate", "find_spec", "spec_from_file_location"}
#: The only reviewed exceptions: (file, function, name) -> why no stream entry reaches it.
ALLOWED = {
    ("streams_sched/wire/codec.py", "_load", "load_object"): "imports STREAMS_REQUEST_CLASSES / STREAMS_META_CLASSES, settings, at start",
    ("streams_sched/wire/codec.py", "<module>", "load_object"): "the import of the above",
    ("streams_sched/wire/meta_codecs.py", "registered_codecs", "load_object"): "imports STREAMS_META_CODECS, a setting, at start",
    ("streams_sched/wire/meta_codecs.py", "<module>", "importlib.util"): "for the find_spec below",
    ("streams_sched/wire/meta_codecs.py", "_page_method_codec", "find_spec"): "is scrapy-playwright installed? (a fixed name)",
    ("streams_sched/cli/options.py", "load_fingerprinter", "load_object"): "imports --fingerprinter of push, load and url, the operator's own option, as Scrapy imports REQUEST_FINGERPRINTER_CLASS",
    ("streams_sched/scrapy_redis/migrate.py", "<module>", "pickle"): "scrapy-redis queues, only with --trust-pickle; only the CLI imports migrate.py",
}
SCANNED = ("streams_sched", "reclaimer", "monitor")


def dynamic_code_sites(root: Path) -> list[tuple[str, str, str]]:
    """(file, enclosing function, what) for every import of a banned module, every call of a
    banned name, every ``importlib`` import other than ``importlib.resources``, and every
    lookup in ``builtins`` by a computed name, in the package and the daemons."""
    found: list[tuple[str, str, str]] = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found += [(rel, scope, what) for scope, what in _scan(ast.parse(path.read_text(), rel), "<module>")]
    return found


def _scan(node: ast.AST, scope: str) -> list[tuple[str, str]]:
    """(innermost enclosing function, what) for ``node`` and everything under it."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = node.name
    out = [(scope, what) for what in _banned(node)]
    for child in ast.iter_child_nodes(node):
        out += _scan(child, scope)
    return out


def _banned(node: ast.AST) -> list[str]:
    def bad_module(name: str) -> bool:
        top = name.split(".")[0]
        return top in BANNED_MODULES or (top == "importlib" and name != "importlib.resources")

    if isinstance(node, ast.Import):
        return [a.name for a in node.names if bad_module(a.name)]
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        if module == "importlib":
            return [f"importlib.{a.name}" for a in node.names if a.name != "resources"]
        if bad_module(module):
            return [module]
        return [a.name for a in node.names if a.name in BANNED_CALLS]
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id in BANNED_CALLS:
            return [func.id]
        if isinstance(func, ast.Attribute) and (
            func.attr in BANNED_METHODS or (_is_builtins(func.value) and func.attr in BANNED_CALLS)
        ):
            return [func.attr]
        if isinstance(func, ast.Name) and func.id in ("getattr", "vars") and node.args and _is_builtins(node.args[0]):
            return [f"{func.id}(builtins, ...)"]
    if isinstance(node, ast.Attribute) and node.attr == "__dict__" and _is_builtins(node.value):
        return ["builtins.__dict__"]
    if isinstance(node, ast.Subscript) and _is_builtins(node.value):
        return ["__builtins__[...]"]
    return []


def _is_builtins(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("builtins", "__builtins__")


def test_no_pickle_eval_or_import_from_data_in_the_package() -> None:
    """Neither the package nor the daemons import pickle-like modules, evaluate text, import
    by a computed name (importlib, load_object, __import__) or look names up in builtins,
    except the reviewed uses in ALLOWED (settings read at start; migrate.py's pickle)."""
    found = dynamic_code_sites(PACKAGE.parent)
    unexpected = [site for site in found if site not in ALLOWED]
    assert unexpected == []
    assert set(found) == set(ALLOWED), "an ALLOWED entry no longer exists: remove it"
    # migrate.py (pickle, behind --trust-pickle) is imported by the CLI only, never by a worker
    importers = [
        path.name for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "migrate"
    ]
    assert set(importers) == {"scrapy_redis.py"}


def test_the_code_scan_finds_each_way_of_running_code(tmp_path: Path) -> None:
    """The scan above catches each banned form, so its empty result means something."""
    for top in SCANNED:
        (tmp_path / top).mkdir()
    (tmp_path / "monitor" / "x.py").write_text(
        "import importlib\nimport pickle\nfrom importlib import import_module\n"
        "from scrapy.utils.misc import load_object\nimport builtins\n"
        "def f(name):\n"
        "    importlib.import_module(name); load_object(name); getattr(builtins, name)\n"
        "    eval(name); __import__(name); builtins.__dict__[name]; builtins.exec(name)\n"
    )
    (tmp_path / "reclaimer" / "ok.py").write_text("from importlib import resources\nx = getattr(object, 'y', None)\nimport re\nre.compile('a')\n")
    whats = sorted(what for _, _, what in dynamic_code_sites(tmp_path))
    assert whats == sorted([
        "importlib", "pickle", "importlib.import_module", "load_object", "import_module",
        "load_object", "getattr(builtins, ...)", "eval", "__import__", "builtins.__dict__", "exec",
    ])


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """A CA generated for this test run, with server and client certificates."""
    return make_tls_files(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture
def tls_server(tls_files: TlsFiles) -> Iterator[RedisServer]:
    """A redis-server that speaks only TLS and requires a client certificate."""
    server = RedisServer(tls=tls_files, tls_auth_clients="yes")
    try:
        server.start()
    except RuntimeError as exc:
        if "tls" in str(exc).lower() or "TLS" in server.log():
            missing(f"this redis-server has no TLS support (Debian's redis-server has it): {exc}")
        raise
    try:
        yield server
    finally:
        server.cleanup()


def tls_url(server: RedisServer, files: TlsFiles, ca: str | None = None) -> str:
    return (
        f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={ca or files.ca}"
        f"&ssl_certfile={files.client_cert}&ssl_keyfile={files.client_key}"
    )


@pytest.mark.e2e
def test_worker_crawls_over_mutual_tls_as_an_acl_user(tls_server: RedisServer, tls_files: TlsFiles, crawl: str, tmp_path: Path) -> None:
    """A worker reaches a TLS-only redis-server (CA generated by the test, client certificate
    required) as an ACL user with the worker rules, and crawls everything."""
    admin = connect(tls_url(tls_server, tls_files))
    acl.setuser(admin, "worker", "w-secret", "worker", crawl)
    url = with_user(tls_url(tls_server, tls_files), "worker", "w-secret")
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=40), tmp_path / "w.log")
    crawl_to_end(w)
    assert set(crawled_urls(items)) == SyntheticWeb(sites=2, pages=40).all_urls()
    assert acl.denials(admin, "worker") == []
    assert "rediss://worker:***@127.0.0.1" in w.log() and "w-secret" not in w.log()


@pytest.mark.e2e
def test_server_certificate_from_another_ca_fails_at_once(tls_server: RedisServer, tls_files: TlsFiles, tmp_path: Path) -> None:
    """A server certificate that does not verify against ssl_ca_certs is an immediate, clear error."""
    other = make_tls_files(str(tmp_path / "other-ca"))
    url = tls_url(tls_server, tls_files, ca=other.ca)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="TLS certificate verification failed.*ssl_ca_certs"):
        connect_ready(url, 30)
    assert time.monotonic() - started < 10


@pytest.mark.e2e
def test_tls_without_a_client_certificate_is_refused(tls_server: RedisServer, tls_files: TlsFiles) -> None:
    """The server requires a client certificate: without one no command gets through."""
    url = f"rediss://127.0.0.1:{tls_server.port}/0?ssl_ca_certs={tls_files.ca}"
    with pytest.raises(RedisUnavailable, match="client certificate"):
        connect_ready(url, 1)


@pytest.mark.e2e
def test_password_in_the_url_authenticates(tmp_path: Path) -> None:
    """requirepass: the password in REDIS_URL (redis://:password@host) authenticates the default user."""
    with RedisServer(extra_args=["--requirepass", "p@ss/word"]) as server:
        good = f"redis://:{quote('p@ss/word', safe='')}@127.0.0.1:{server.port}/0"
        assert connect_ready(good, 5).ping()
        with pytest.raises(RedisUnavailable, match="refused the credentials") as info:
            connect_ready(f"redis://127.0.0.1:{server.port}/0", 30)
        assert "p@ss" not in str(info.value)


def test_role_rules_follow_the_scripts() -> None:
    """The ACL rules are read from the shipped Lua: each role allows every command of its scripts."""
    assert {"xreadgroup", "xack", "xautoclaim"} <= acl.script_commands("lease") | acl.script_commands("claim")
    assert "setrange" in acl.script_commands("enqueue")  # through lib/bloom.lua's bitmap Bloom helper
    worker = set(acl.rules("worker", "c"))
    for script in ("enqueue", "lease", "claim", "ack", "dead", "release", "promote", "status"):
        assert {f"+{c}" for c in acl.script_commands(script)} <= worker, script
    reclaimer = set(acl.rules("reclaimer"))
    assert "+xreadgroup" not in reclaimer and "+setrange" not in reclaimer  # it neither leases nor dedupes
    monitor = acl.rules("monitor")
    assert not any(r.startswith("+") and r[1:] in ("evalsha", "script|load", "xadd") for r in monitor)


def _expired_work(url: str, crawl: str) -> Any:
    """A crawl with 5 expired leases of a gone worker and one due delayed request."""
    import hashlib

    from streams_sched.frontier.records import Entry

    def out(i: Any, delay_ms: int = 0) -> Entry:
        return Entry(hashlib.sha1(str(i).encode()).digest(), 1, delay_ms, f"payload-{i}".encode())

    f = frontier(url, crawl)
    f.register()
    f.register_sites(["a.test", "b.test"])
    f.enqueue("a.test", [out(i) for i in range(5)])
    f.enqueue("b.test", [out("later", delay_ms=1)])
    f.lease("a.test", "gone", 5, (1, 1, 1))
    f.record_node("gone", {"node": "gone", "state": "online", "last_seen": time.time() - 100, "heartbeat_s": 0.2, "lease_s": 0.05})
    return f


@pytest.mark.e2e
def test_reclaimer_runs_with_only_its_acl_rules(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """The reclaimer daemon as a user with only the reclaimer rules requeues, promotes, prunes,
    keeps its health key and stops cleanly, denied nothing."""
    from daemons import Daemon

    f = _expired_work(plain_redis_url, crawl)
    admin = f.client
    admin.execute_command("ACL LOG", "RESET")
    acl.setuser(admin, "reclaimer", "r-secret", "reclaimer")
    try:
        url = with_user(plain_redis_url, "reclaimer", "r-secret")
        d = Daemon("reclaimer", ["--redis-url", url, "--interval", "0.2", "--name", "acl"], tmp_path / "r.log")
        try:
            passes = d.wait_event("pass", count=3)
            assert sum(p["requeued"] for p in passes) == 5 and sum(p["promoted"] for p in passes) == 1
            assert d.terminate() == 0
        finally:
            d.close()
        st = f.status("a.test")
        assert (st.backlog, st.pending) == (5, 0)
        assert acl.denials(admin, "reclaimer") == [], acl.denials(admin, "reclaimer")
        assert "r-secret" not in d.log()
    finally:
        acl.deluser(admin, "reclaimer")


@pytest.mark.e2e
def test_monitor_runs_with_only_its_acl_rules(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """The monitor daemon as a user with only the monitor rules exports the crawl's metrics and
    hears node events, denied nothing; the same user cannot write."""
    from streams_sched.testing import free_port

    from daemons import Daemon, try_scrape, value

    f = _expired_work(plain_redis_url, crawl)
    admin = f.client
    admin.script_flush()  # the monitor cannot SCRIPT LOAD: EVAL_RO must do
    admin.execute_command("ACL LOG", "RESET")
    acl.setuser(admin, "monitor", "m-secret", "monitor")
    try:
        url = with_user(plain_redis_url, "monitor", "m-secret")
        port = free_port()
        d = Daemon("monitor", ["--redis-url", url, "--metrics-port", str(port), "--interval", "0.3"], tmp_path / "m.log")
        try:
            m = wait_for(lambda: try_scrape(port), timeout=20, what="/metrics")
            assert value(m, "streams_sched_pending", crawl=crawl, site="a.test") == 5
            d.wait_event("pass", count=2)
            assert not d.named("events_disabled") and not d.named("redis_refused") and not d.named("read_failed")
            assert d.terminate() == 0
        finally:
            d.close()
        assert acl.denials(admin, "monitor") == [], acl.denials(admin, "monitor")
        with pytest.raises(redis.exceptions.NoPermissionError):
            connect(url).hset(CrawlKeys(crawl).nodes, "n", "x")
    finally:
        acl.deluser(admin, "monitor")


@pytest.mark.targets("cluster")
@pytest.mark.cluster
def test_monitor_rules_read_many_sites_on_a_cluster(redis_url: str, crawl: str) -> None:
    """On Redis Cluster, a user with only the monitor rules reads the status of sites on
    every shard in one call per node (EVALSHA_RO), denied nothing."""
    import hashlib

    from streams_sched.frontier.client import Frontier
    from streams_sched.frontier.records import Entry

    f = frontier(redis_url, crawl)
    per_node: dict[str, list[str]] = {}
    for n in range(1000):  # two sites on each of the three nodes
        site = f"{hashlib.sha1(str(n).encode()).hexdigest()[:8]}.test"
        group = per_node.setdefault(f.client.get_node_from_key(f.site(site).tag).name, [])
        if len(group) < 2:
            group.append(site)
        if sum(len(g) for g in per_node.values()) == 6:
            break
    sites = [s for group in per_node.values() for s in group]
    for i, site in enumerate(sites):
        f.enqueue(site, [Entry(bytes([i]) * 20, 1, 0, b"x")])
    f.register_sites(sites)
    assert len({f.client.get_node_from_key(f.site(s).tag).name for s in sites}) == 3
    acl.setuser(f.client, "monitor", "pw", "monitor")
    try:
        ro = Frontier(connect(with_user(redis_url, "monitor", "pw")), crawl)
        statuses = ro.status_many(ro.sites())
        assert [s.site for s in statuses] == sorted(sites) and all(s.backlog == 1 for s in statuses)
        assert acl.denials(f.client, "monitor") == []
    finally:
        acl.deluser(f.client, "monitor")


@pytest.mark.parametrize(("user", "role", "crawl"), [("worker-shop", "worker", "shop"), ("reclaimer", "reclaimer", None), ("monitor", "monitor", None)])
def test_the_acl_rules_in_the_docs_are_the_ones_each_role_needs(user: str, role: str, crawl: str | None) -> None:
    """docs/operations/security.md prints each role's ACL SETUSER rules exactly as acl.rules makes them (an operator copies them)."""
    from streams_sched.admin.acl import rules

    text = (Path(__file__).resolve().parent.parent / "docs/operations/security.md").read_text()
    start = text.index(f"ACL SETUSER {user} reset on >CHANGE-ME ")
    block = text[start : text.index("```", start)].split()
    assert block[6:] == rules(role, crawl)
