"""The synthetic web over real HTTP: site ``s`` answers on 127.0.0.(s+1):PORT.

Every address in 127.0.0.0/8 is loopback on Linux, so each site is its own
host (and so its own streams-sched site and Scrapy download slot) without any
DNS set-up.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from streams_sched.demo.web import SyntheticWeb

__all__ = ["SyntheticServer"]


class _Handler(BaseHTTPRequestHandler):
    web: SyntheticWeb
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        host, port = self.server.server_address[:2]  # type: ignore[index,str-unpack]
        url = f"http://{host}:{port}{self.path}"
        where = self.web.parse(url)
        if where is None:
            body, status = b"<html>not found</html>", 404
        else:
            body, status = self.web.html(*where), 200
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a worker killed mid-request resets its connections: nothing to report
        pass


class SyntheticServer:
    """One threaded HTTP server per site, on 127.0.0.(site+1):port."""

    def __init__(self, sites: int, pages: int, port: int) -> None:
        self.web = SyntheticWeb(sites=sites, pages=pages, base="http://127.0.0.{ip}:" + str(port) + "/p/{page}")
        handler = type("Handler", (_Handler,), {"web": self.web})
        self.servers = [_Server((f"127.0.0.{s + 1}", port), handler) for s in range(sites)]
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    def start(self) -> SyntheticServer:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()
