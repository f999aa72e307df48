"""Run one Scrapy worker: ``python worker.py SPIDER_CLASS SETTINGS_JSON``."""

from __future__ import annotations

import json
import sys

from scrapy.crawler import CrawlerProcess
from scrapy.utils.misc import load_object


def main() -> None:
    spider = load_object(sys.argv[1])
    settings = json.loads(sys.argv[2])
    process = CrawlerProcess(settings)
    process.crawl(spider)
    process.start()
    # like `scrapy crawl`: a crawl that failed to start exits 1
    sys.exit(1 if process.bootstrap_failed else 0)


if __name__ == "__main__":
    main()
