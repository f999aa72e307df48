"""streams-sched load as a process: SIGKILLed halfway and run again, it ends with every request once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from scrapy import Request

from streams_sched.transfer.records import DeadInfo, End, Header, RequestLine
from streams_sched.wire.codec import RequestCodec

from helpers import wait_for
from transfer_helpers import dump_lines, frontier_of, records

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent


def _big_dump(path: Path, sites: int, per_site: int) -> Counter[str]:
    """A dump of ``sites`` x ``per_site`` requests, every tenth a dont_filter repeat of the one
    before and every fiftieth a dead letter; returns the multiset a load must end with."""
    encode = RequestCodec(None).encode
    want: Counter[str] = Counter()
    with open(path, "w") as out:
        out.write(Header(crawl="big", time_ms=1_700_000_000_000, dump_id="kill-test-0001").line() + "\n")
        n = 0
        for s in range(sites):
            site = f"site{s}.test"
            for i in range(per_site):
                url = f"http://{site}/p{i}"
                repeat = i % 10 == 9
                payload = encode(Request(f"http://{site}/p{i - 1}" if repeat else url, dont_filter=repeat))
                if i % 50 == 49:
                    line = RequestLine(site, "", "dead", 1, payload, dead=DeadInfo("gave up", 3, "w1", 1, "1-0"))
                else:
                    line = RequestLine(site, "", "queued", 1, payload)
                out.write(line.line("big", 1_700_000_000_000) + "\n")
                want[f"{line.state}|{line.url or url}|{payload.hex()}"] += 1
                n += 1
        out.write(End(n, sites, 0, n + 2, 1_700_000_000_000).line() + "\n")
    return want


def _load(url: str, path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "streams_sched.cli", "load", "-c", "big", str(path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.cluster
def test_a_load_killed_halfway_and_run_again_ends_with_every_request_once(
    redis_url: str, tmp_path: Path, measured: object
) -> None:
    """SIGKILL a load when part of a file is in, run it again: every request, dont_filter repeats and dead letters included, is in the crawl exactly once."""
    path = tmp_path / "big.jsonl"
    want = _big_dump(path, sites=200, per_site=300)
    f = frontier_of(redis_url, "big")
    proc = _load(redis_url, path)

    def loaded() -> int:
        pipe = f.client.pipeline(transaction=False)
        for n in range(f.shards):
            pipe.hget(f.shard(n).stats, "enqueued")
        return sum(int(v or 0) for v in pipe.execute())

    total = sum(want.values())
    wait_for(lambda: loaded() >= total // 3 or proc.poll() is not None, timeout=120, what="a third of the file loaded")
    assert proc.poll() is None, "the load ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = loaded()
    assert 0 < at_kill < total
    again = _load(redis_url, path)
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0, output.decode()[-3000:]
    got: Counter[str] = Counter()
    for r in records(dump_lines(redis_url, "big")):
        if isinstance(r, RequestLine):
            got[f"{r.state}|{r.url}|{r.payload.hex()}"] += 1
    assert got == want
    measured(f"killed with {at_kill}/{total} requests in; after the second run every one once "
             f"({sum(1 for k in want if k.startswith('dead'))} dead letters, {total // 10} dont_filter repeats)")
