"""Run zoo spiders side by side in one process, as ``scrapy crawl`` runs one:
``python -m zoo.run SETTINGS_JSON NAME [NAME ...]``. Exits 1 if a crawl failed."""

from __future__ import annotations

import json
import sys

from scrapy.crawler import CrawlerProcess

from zoo.spiders import ZOO


def main() -> None:
    settings = json.loads(sys.argv[1])
    process = CrawlerProcess(settings)
    for name in sys.argv[2:]:
        process.crawl(ZOO[name])
    process.start()
    sys.exit(1 if process.bootstrap_failed else 0)


if __name__ == "__main__":
    main()
