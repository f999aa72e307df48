"""A Prometheus ``/metrics`` endpoint for one registry, for the worker and the daemons."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MetricsServer"]


class MetricsServer:
    """Serves one prometheus-client registry on ``/metrics`` from a daemon thread."""

    def __init__(self, registry: Any, port: int, addr: str = "0.0.0.0") -> None:
        self.registry = registry
        self.addr = addr
        self.requested_port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> MetricsServer:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.requested_port, self.addr, self.registry)
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {self.addr}:{self.requested_port} ({exc.strerror or exc});"
                " choose another --metrics-port"
            ) from None
        return self

    @property
    def port(self) -> int:
        return int(self._server.server_port) if self._server is not None else self.requested_port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
