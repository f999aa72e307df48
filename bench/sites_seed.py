"""The seeding steps of ``python -m bench sites`` that must run the streams_sched under test.

In a ``KIND@REV`` run they import that revision's streams_sched (bench/revision.py),
so the harness runs them as processes, the way it runs the workers and
``streams-sched push``::

    python -m bench.sites_seed prepare REDIS_URL CRAWL DEDUPE
    python -m bench.sites_seed api REDIS_URL CRAWL DEDUPE URL_FILE

``prepare`` fixes the crawl's dedupe back-end (DEDUPE is a STREAMS_DEDUPE value, as
the workers will have it) and does what a Seeder does when it is made (its
scripts, the crawl's dedupe parameters): a cost per crawl, kept out of the
bytes per queued site. ``api`` prepares, then times ``Seeder.seed()`` on every
URL of the file (read beforehand), in wall time and in this process's CPU time.
Each prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def prepare(redis_url: str, crawl: str, dedupe: str) -> Any:
    import streams_sched
    from bench.layout import first

    client = first("streams_sched.connect.clients", "streams_sched.connection").connect(redis_url)
    first("streams_sched.frontier.bloom", "streams_sched.frontier").detect_dedupe(client, crawl, dedupe)
    streams_sched.Seeder(client, crawl).close()
    return client


def main(argv: list[str]) -> int:
    mode, redis_url, crawl, dedupe, *rest = argv
    import streams_sched

    out: dict[str, Any] = {"streams_sched_from": streams_sched.__file__}
    if mode == "prepare":
        prepare(redis_url, crawl, dedupe).close()
    elif mode == "api":
        urls = Path(rest[0]).read_text().split()
        client = prepare(redis_url, crawl, dedupe)
        t = time.perf_counter()
        with streams_sched.Seeder(client, crawl) as seeder:
            made, cpu = time.perf_counter(), time.process_time()
            result = seeder.seed(urls)
            done, cpu = time.perf_counter(), time.process_time() - cpu
        client.close()
        out.update({"urls": len(urls), "added": len(result.added), "duplicates": len(result.duplicates),
                    "seed_s": done - made, "seed_cpu_s": cpu, "setup_s": made - t})
    else:
        raise SystemExit(f"unknown mode {mode!r}: prepare or api")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
