"""A synthetic web, a spider and helpers for the demo, the tests and the benchmarks.

- :mod:`.web`: a deterministic web of N sites x M pages with duplicate links;
- :mod:`.handler`: a Scrapy download handler that serves it without a network;
- :mod:`.server`: the same web over real HTTP on 127.0.0.1;
- :mod:`.spider`: a spider that follows every link and yields one item per page;
- :mod:`.pipelines`: records crawled URLs in a file, one line per item, safe under SIGKILL.
"""
