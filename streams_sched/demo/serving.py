"""A small threading HTTP/1.1 server around one answer function, for the demo and the tests.

Every local web of the demo and the tests answers a GET from its path, host and headers;
this is the one place that turns such an answer into an HTTP response. It stays quiet:
no access log, and no traceback when a client (a killed worker, a browser that gave up)
resets its connection.
"""

from __future__ import annotations

from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Answer", "answering_server"]

#: (status, headers, body); Content-Length is added
Answer = tuple[int, dict[str, str], bytes]


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client reset its connection: nothing to report


def answering_server(answer: Callable[[BaseHTTPRequestHandler], Answer], port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server on ``host:port`` (0: a free port) whose GETs ``answer(handler)`` answers;
    serve it with ``serve_forever`` on a thread of your own."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, headers, body = answer(self)
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up on it (a timeout, a crashed tab, a killed worker)

    return _QuietServer((host, port), Handler)
