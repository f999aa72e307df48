"""One benchmark worker process: ``python -m bench.worker SETTINGS_JSON``.

Counts Redis round trips (see :mod:`bench.probe`) and runs the synthetic
spider (or the one ``BENCH_SPIDER`` names, ``module:Class``) with the given Scrapy
settings in a fresh interpreter, so every scheduler starts from the same state.
"""

from __future__ import annotations

import importlib
import json
import sys


def main() -> None:
    from bench.probe import install_round_trip_counter

    install_round_trip_counter()

    from scrapy.crawler import CrawlerProcess

    from streams_sched.demo.spider import SyntheticSpider

    settings = json.loads(sys.argv[1])
    if settings.get("BENCH_SWITCH_INTERVAL_S"):
        sys.setswitchinterval(float(settings["BENCH_SWITCH_INTERVAL_S"]))
    if settings.get("BENCH_COUNT_CALLS"):
        from bench.probe import install_call_counters

        install_call_counters()
    spider: type = SyntheticSpider
    if settings.get("BENCH_SPIDER"):
        module, _, name = settings["BENCH_SPIDER"].partition(":")
        spider = getattr(importlib.import_module(module), name)
    process = CrawlerProcess(settings)
    process.crawl(spider)
    process.start()


if __name__ == "__main__":
    main()
