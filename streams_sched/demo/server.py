"""The synthetic web over real HTTP: site ``s`` answers on 127.0.0.(s+1):PORT.

Every address in 127.0.0.0/8 is loopback on Linux, so each site is its own
host (and so its own streams-sched site and Scrapy download slot) without any
DNS set-up.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler

from streams_sched.demo.serving import Answer, answering_server
from streams_sched.demo.web import SyntheticWeb

__all__ = ["SyntheticServer"]


class SyntheticServer:
    """One threaded HTTP server per site, on 127.0.0.(site+1):port."""

    def __init__(self, sites: int, pages: int, port: int) -> None:
        self.web = SyntheticWeb(sites=sites, pages=pages, base="http://127.0.0.{ip}:" + str(port) + "/p/{page}")
        self.servers = [answering_server(self._answer, port, f"127.0.0.{s + 1}") for s in range(sites)]
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def _answer(self, handler: BaseHTTPRequestHandler) -> Answer:
        host, port = handler.server.server_address[:2]  # type: ignore[str-unpack,index]
        where = self.web.parse(f"http://{host}:{port}{handler.path}")
        if where is None:
            return 404, {"Content-Type": "text/html; charset=utf-8"}, b"<html>not found</html>"
        return 200, {"Content-Type": "text/html; charset=utf-8"}, self.web.html(*where)

    def start(self) -> SyntheticServer:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()
