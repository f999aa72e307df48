"""Security: ACL users with only their role's rules, AUTH in the URL, TLS, and no code from the queue."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import redis

from helpers import Worker, base_settings, crawled_urls, frontier, with_user
from streams_sched import acl
from streams_sched.connection import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.keys import CrawlKeys, SiteKeys

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
        try:
            assert w.wait(120) == 0, w.log()
        finally:
            w.close()
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
        mine.xadd(SiteKeys(crawl, "a.test").stream("http", "default"), {"r": b"x"})
        other = "other-" + crawl
        with pytest.raises(redis.exceptions.NoPermissionError):
            mine.xadd(SiteKeys(other, "a.test").stream("http", "default"), {"r": b"x"})
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
            lambda: ro.xadd(SiteKeys(crawl, "a.test").stream("http", "high"), {"r": "x"}),
            lambda: ro.hset(CrawlKeys(crawl).nodes, "n", "x"),
            lambda: ro.evalsha(f.scripts.ack.sha, 0),
            lambda: ro.script_load("return 1"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                write()
    finally:
        acl.deluser(admin, "monitor")


def test_no_pickle_eval_or_import_from_data_in_the_package() -> None:
    """No module of the package imports pickle/marshal/shelve or calls eval/exec/__import__."""
    banned_modules = {"pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "jsonpickle"}
    banned_calls = {"eval", "exec", "__import__", "compile"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path.name, a.name) for a in node.names if a.name.split(".")[0] in banned_modules]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in banned_modules:
                found.append((path.name, node.module))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in banned_calls:
                found.append((path.name, node.func.id))
    assert found == []
