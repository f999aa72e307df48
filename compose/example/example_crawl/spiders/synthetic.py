"""The demo spider: follows every link of the synthetic web, one item per page."""

from streams_sched.demo.spider import SyntheticSpider as _Base


class SyntheticSpider(_Base):
    name = "synthetic"
