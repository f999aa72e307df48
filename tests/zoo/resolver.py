"""A Scrapy DNS resolver that sends the zoo's host names to 127.0.0.1.

Set ``TWISTED_DNS_RESOLVER`` (``DNS_RESOLVER`` on Scrapy 2.13) to ``"zoo.resolver.ZooResolver"``: spiders keep their
real-looking URLs (``http://a.zoo.test:PORT/``), the Host header names the site,
and every other name resolves as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer

ZONE = ".zoo.test"


class ZooResolver(CachingThreadedResolver):
    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> Any:
        if name.endswith(ZONE):
            return defer.succeed("127.0.0.1")
        return super().getHostByName(name, timeout)
