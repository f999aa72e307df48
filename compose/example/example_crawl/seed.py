"""Push the seeds of the synthetic web (page 0 of every site) into the example crawl."""

import os

from streams_sched import seed
from streams_sched.connect.clients import connect, wait_ready
from streams_sched.demo.web import SyntheticWeb


def main() -> None:
    url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    client = connect(url)
    wait_ready(client, url, 60)
    web = SyntheticWeb(sites=int(os.environ.get("SYNTH_SITES", "20")), pages=int(os.environ.get("SYNTH_PAGES", "1000")))
    result = seed(client, os.environ.get("STREAMS_PREFIX", "example"), web.seeds())
    print(f"pushed {len(result.added)} seed(s) ({len(result.duplicates)} already seen)")


if __name__ == "__main__":
    main()
