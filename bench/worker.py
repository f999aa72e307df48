"""One benchmark worker process: ``python -m bench.worker SETTINGS_JSON``.

Counts Redis round trips (see :mod:`bench.probe`) and runs the synthetic
spider with the given Scrapy settings in a fresh interpreter, so every
scheduler starts from the same state.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from bench.probe import install_round_trip_counter

    install_round_trip_counter()

    from scrapy.crawler import CrawlerProcess

    from streams_sched.demo.spider import SyntheticSpider

    settings = json.loads(sys.argv[1])
    process = CrawlerProcess(settings)
    process.crawl(SyntheticSpider)
    process.start()


if __name__ == "__main__":
    main()
