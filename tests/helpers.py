"""Helpers shared by the tests: waiting on conditions, worker processes, reading results."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from itemadapter import ItemAdapter

from streams_sched.connect.clients import connect
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import BloomParams

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def missing(reason: str) -> None:
    """Skip the test locally; under CI (``CI`` set) fail it, since no test may skip there."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)")
    pytest.skip(reason)


#: the CRITICAL line a worker that cannot start prints (streams_sched/worker/startup.py)
START_ERROR = "CRITICAL: streams-sched cannot start:"


def start_errors(output: str) -> list[str]:
    """The start-up error lines of a worker's output."""
    return [line for line in output.splitlines() if START_ERROR in line]


def max_in_window(times: list[float], window: float = 1.0) -> int:
    """The most events within any ``window`` seconds."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def find_tool(name: str, install: str) -> str:
    """Path of the command-line tool ``name``, on PATH or in the virtualenv's bin directory
    (where scripts/bootstrap.sh puts promtool); skip (fail under CI) when it is nowhere."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        missing(f"{name} not installed ({install}; scripts/test.sh provides it as root on Debian)")
    assert path is not None
    return path


def wait_for(
    condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.02, what: str = "",
    error: type[Exception] = AssertionError,
) -> Any:
    """Poll ``condition`` until it returns something truthy; raise ``error`` after ``timeout``
    seconds (an AssertionError fails the test; the fault campaign takes a TimeoutError as a
    stall to report)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise error(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(interval)


def subscribe_events(url: str, crawl: str) -> Any:
    """A pub/sub connection subscribed to the crawl's node events (before a worker starts)."""
    from streams_sched.frontier.keys import CrawlKeys

    events = connect(url).pubsub()
    events.subscribe(CrawlKeys(crawl).events)
    return events


def wait_heartbeats(events: Any, n: int, worker: Worker | None = None, timeout: float = 30.0) -> None:
    """Drop the events received so far, then wait for ``n`` more heartbeats: each one is a
    cycle of a worker's I/O thread (lease, drain check), so "nothing happened" after them is
    a count, not a guess of how long is enough. Fails at once if ``worker`` exits."""
    while events.get_message(timeout=0) is not None:
        pass
    deadline = time.monotonic() + timeout
    beats = 0
    while beats < n:
        assert time.monotonic() < deadline, f"timed out waiting for {n} heartbeats"
        assert worker is None or worker.alive(), f"the worker exited; log:\n{worker.log()}"
        msg = events.get_message(timeout=0.5)
        if msg is not None and msg["type"] == "message" and json.loads(msg["data"])["event"] == "heartbeat":
            beats += 1


def frontier(url: str, crawl: str, dedupe: str = "bitmap", **bloom: Any) -> Frontier:
    mode = "bf" if dedupe == "redisbloom" else "bitmap"
    return Frontier(connect(url), crawl, BloomParams(mode=mode, **bloom))


def inbox_of(f: Frontier, site: str) -> list[tuple[int, bytes]]:
    """The requests ``site`` keeps in its shard's inbox (a site with no stream keeps up to 8
    there, lua/lib/inbox.lua): (stream index, payload) each, in their order."""
    import msgpack

    from streams_sched.frontier.keys import stream_of_code

    raw = f.client.hget(f.site(site).index.inbox, site)
    if raw is None:
        return []
    unpacker = msgpack.Unpacker(raw=True)
    unpacker.feed(raw)
    flat = next(unpacker)  # then 117 if its requests are not yet counted as enqueued (lua/lib/inbox.lua)
    return [(stream_of_code(int(code)), bytes(payload)) for code, payload in zip(flat[::2], flat[1::2], strict=True)]


def queued(f: Frontier, site: str, task: str, band: str = "default") -> list[bytes]:
    """Payloads queued for ``site``'s (task, band) stream, wherever they wait: the stream's
    entries, then those still in its shard's inbox (the next lease moves them into the stream)."""
    from streams_sched.frontier.keys import STREAMS

    index = STREAMS.index((task, band))
    in_stream = [fields[b"r"] for _, fields in f.client.xrange(f.site(site).streams[index])]
    return in_stream + [payload for stream, payload in inbox_of(f, site) if stream == index]


def error_replies(client: Any) -> int:
    """Error replies Redis counted since it started (INFO errorstats), summed over the nodes."""
    if hasattr(client, "get_nodes"):  # a cluster client: every node's section
        per_node = client.info("errorstats", target_nodes=client.ALL_NODES).values()
    else:
        per_node = [client.info("errorstats")]
    return sum(int(v["count"]) for info in per_node for v in info.values() if isinstance(v, dict))


def false_positive_rate(f: Frontier, site: str, batch: Callable[[list[str]], list[Any]], probes: int = 4000) -> float:
    """The share of ``probes`` new URLs that ``site``'s seen filter calls duplicates. Each
    batch of 200 is probed on a fresh copy of the filter (DUMP/RESTORE: RedisBloom keys do
    not support COPY) under the site ``probe``, so the probes themselves do not fill it.
    ``batch`` turns URL names into the entries to enqueue."""
    false = 0
    for i in range(0, probes, 200):
        for key in ("seen", "seen_meta"):
            src, dst = getattr(f.site(site), key), getattr(f.site("probe"), key)
            dumped = f.client.dump(src)
            f.client.delete(dst)
            if dumped is not None:
                f.client.restore(dst, 0, dumped)
        false += f.enqueue("probe", batch([f"out{j}" for j in range(i, i + 200)]))[1]
    return false / probes


def with_user(url: str, user: str, password: str) -> str:
    """``url`` with ``user:password@`` in it (the form REDIS_URL takes for ACL users)."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@{rest.split('@', 1)[-1]}"


#: the remote-control extension listens on a port; older Scrapy has none (and 2.16 fails to load the name)
_NO_REMOTE_CONTROL = (
    {"scrapy.extensions.remote_control.RemoteControl": None}
    if importlib.util.find_spec("scrapy.extensions.remote_control") is not None
    else {}
)


def base_settings(redis_url: str, crawl: str, dedupe: str, record: Path, **extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "REDIS_URL": redis_url,
        "STREAMS_PREFIX": crawl,
        "STREAMS_DEDUPE": dedupe,
        "STREAMS_IDLE_POLL_SECONDS": 0.2,
        "STREAMS_HEARTBEAT_SECONDS": 0.5,
        "DOWNLOAD_HANDLERS": {"http": "streams_sched.demo.handler.SyntheticHandler"},
        "ITEM_PIPELINES": {"streams_sched.demo.pipelines.RecordPipeline": 100},
        "RECORD_FILE": str(record),
        "LOG_LEVEL": "INFO",
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "EXTENSIONS": _NO_REMOTE_CONTROL,
        "SYNTH_SITES": 3,
        "SYNTH_PAGES": 100,
    }
    settings.update(extra)
    return settings


class Worker:
    """A Scrapy worker in its own process (tests/worker.py), killable with SIGKILL."""

    def __init__(
        self, settings: dict[str, Any], log: Path, spider: str = "streams_sched.demo.spider.SyntheticSpider",
        new_session: bool = False, clock_skew_s: float = 0.0,
    ) -> None:
        """``new_session``: the worker leads a process group of its own, so that
        :meth:`close` takes its children (a browser) down with it, as systemd's
        KillMode=control-group does. ``clock_skew_s``: the worker's wall clock
        (``time.time()``) is that many seconds ahead (behind, if negative) of the
        machine's (tests/skewed_clock/sitecustomize.py)."""
        self.log_path = log
        self.new_session = new_session
        env = dict(os.environ)
        path = [str(HERE), str(ROOT), env.get("PYTHONPATH", "")]
        if clock_skew_s:
            path.insert(0, str(HERE / "skewed_clock"))
            env["STREAMS_TEST_CLOCK_SKEW_S"] = repr(clock_skew_s)
        env["PYTHONPATH"] = os.pathsep.join(path)
        self.log_file = open(log, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "worker.py"), spider, json.dumps(settings)],
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
        )

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not finish within {timeout}s; log:\n{self.log()}") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        if not self.log_file.closed:
            self.log_file.flush()
        return self.log_path.read_text(errors="replace")[-8000:]

    def close(self) -> None:
        if self.alive():
            self.kill()
        if self.new_session:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log_file.close()


def crawl_to_end(*workers: Worker, timeout: float = 120) -> None:
    """Wait for each worker to exit 0 (failing with its log if not), then close them all."""
    try:
        for w in workers:
            assert w.wait(timeout) == 0, w.log()
    finally:
        for w in workers:
            w.close()


def read_items(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    items = []
    for line in path.read_text().splitlines():
        if line.endswith("}"):
            items.append(json.loads(line))
    return items


def crawled_urls(path: Path) -> Counter[str]:
    return Counter(item["url"] for item in read_items(path))


SCRAPY_PROJECT_SETTINGS = """\
BOT_NAME = "synth_project"
SPIDER_MODULES = ["synth_project.spiders"]
SCHEDULER = "streams_sched.scheduler.StreamsScheduler"
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
DOWNLOAD_HANDLERS = {"http": "streams_sched.demo.handler.SyntheticHandler"}
"""


def scrapy_project(where: Path) -> Path:
    """A minimal Scrapy project (scrapy.cfg, settings, one spider "synth") for `scrapy crawl`."""
    pkg = where / "synth_project"
    (pkg / "spiders").mkdir(parents=True, exist_ok=True)
    (where / "scrapy.cfg").write_text("[settings]\ndefault = synth_project.settings\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(SCRAPY_PROJECT_SETTINGS)
    (pkg / "spiders" / "__init__.py").write_text(
        "from streams_sched.demo.spider import SyntheticSpider\n\n\n"
        "class Synth(SyntheticSpider):\n    name = \"synth\"\n"
    )
    return where


def scrapy_crawl(project: Path, settings: dict[str, Any], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run `scrapy crawl synth -s NAME=VALUE ...` in ``project``; dict and list values go as JSON."""
    args = [sys.executable, "-m", "scrapy", "crawl", "synth"]
    for name, value in settings.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        args += ["-s", f"{name}={text}"]
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "SCRAPY_SETTINGS_MODULE")}
    env["PYTHONPATH"] = os.pathsep.join([str(project), str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=timeout)


def same(a: Any, b: Any, where: str = "") -> None:
    """Deep equality that also requires the same type at every level (and the same tzinfo)."""
    assert type(a) is type(b), (where, a, b)
    if isinstance(a, dict):
        assert list(a) == list(b) and [type(k) for k in a] == [type(k) for k in b], where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, (set, frozenset)):
        assert a == b and sorted(type(x).__name__ for x in a) == sorted(type(x).__name__ for x in b), where
    elif ItemAdapter.is_item(a) and not isinstance(a, dict):
        same(dict(ItemAdapter(a).items()), dict(ItemAdapter(b).items()), where)
        assert a == b, where
    else:
        assert a == b, (where, a, b)
        if isinstance(a, (dt.datetime, dt.time)):
            assert (a.tzinfo, a.fold) == (b.tzinfo, b.fold), where
            if a.tzinfo is not None:
                assert a.tzinfo.tzname(None if isinstance(a, dt.time) else a) == b.tzinfo.tzname(
                    None if isinstance(b, dt.time) else b), where


# -- tracked pages (continuous crawling) --------------------------------------------

#: one site's copies of requests, read in one script so that no page moving between its
#: keys (due: delayed ZSET -> stream; acked: stream -> delayed ZSET) is missed or seen twice.
#: KEYS: the site's delayed ZSET, its six streams, its shard's inbox HASH; ARGV[1]: the site.
_SITE_COPIES = """
local out = {redis.call('ZRANGE', KEYS[1], 0, -1)}
for i = 2, 7 do
  local payloads = {}
  for _, entry in ipairs(redis.call('XRANGE', KEYS[i], '-', '+')) do
    local fields = entry[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'r' then payloads[#payloads + 1] = fields[j + 1] end
    end
  end
  out[#out + 1] = payloads
end
out[#out + 1] = redis.call('HGET', KEYS[8], ARGV[1]) or ''
return out
"""


def _tracked_url(payload: bytes) -> str | None:
    """The URL of a request payload if it is a tracked page's own request (its meta has
    ``_rv``, or a ``revisit`` that tracks it), else None (untracked, or a retry's copy)."""
    import msgpack

    d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    meta = d.get("mt") if isinstance(d, dict) else None
    if not isinstance(meta, dict):
        return None
    if isinstance(meta.get("_rv"), list) or meta.get("revisit") not in (None, False, 0):
        return str(d["u"])
    return None


def tracked_copies(url: str, crawl: str) -> Counter[str]:
    """How many times each tracked page is in the crawl's frontier: as a member of its site's
    delayed ZSET (waiting for its next visit) or as a request queued in one of its streams
    (leased or not) or in its shard's inbox. Each site is read in one script, so the count
    is exact while workers run; on a cluster each site is read on the master that holds it."""
    import msgpack

    f = frontier(url, crawl)
    counts: Counter[str] = Counter()
    for site in f.sites():
        keys = f.site(site)
        reply = f.client.eval(_SITE_COPIES, 8, keys.delayed, *keys.streams, keys.index.inbox, site)
        members, *streams, inbox = reply
        payloads = [bytes(m).split(b":", 2)[2] for m in members]
        payloads += [bytes(p) for stream in streams for p in stream]
        if inbox:
            unpacker = msgpack.Unpacker(raw=True)
            unpacker.feed(bytes(inbox))
            flat = next(unpacker)
            payloads += [bytes(p) for p in flat[1::2]]
        counts.update(u for u in map(_tracked_url, payloads) if u is not None)
    return counts


def tracked_once_problems(url: str, crawl: str, want: set[str], *, mid_crawl: bool = False) -> list[str]:
    """What is wrong with the tracked pages ``want`` in the frontier: pages missing from it
    (lost), pages in it more than once (scheduled twice) and tracked pages that are not
    in ``want``. Empty when each of them is there exactly once. ``mid_crawl``: pages not
    found yet are not missing."""
    copies = tracked_copies(url, crawl)
    lost = [] if mid_crawl else sorted(want - set(copies))
    twice = sorted(u for u, n in copies.items() if n > 1)
    other = sorted(set(copies) - want)
    out = []
    if lost:
        out.append(f"{len(lost)} tracked pages lost (in no delayed ZSET and no stream), e.g. {lost[:5]}")
    if twice:
        out.append(f"{len(twice)} tracked pages in the frontier more than once, e.g. "
                   f"{[(u, copies[u]) for u in twice[:5]]}")
    if other:
        out.append(f"{len(other)} tracked pages that should not be, e.g. {other[:5]}")
    return out


def first_visits(path: Path) -> Counter[str]:
    """crawled_urls without the revisits of tracked pages (TrackedSpider's items say which)."""
    return Counter(item["url"] for item in read_items(path) if not item.get("revisit"))


def revisited(path: Path, since: int = 0) -> set[str]:
    """The URLs revisited in the items from line ``since`` on."""
    return {item["url"] for item in read_items(path)[since:] if item.get("revisit")}
