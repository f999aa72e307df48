"""Helpers for the daemon tests: daemons as real processes, JSON log lines, HTTP scrapes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from helpers import ROOT, wait_for


class Daemon:
    """``python -m <module> ARGS`` with stderr (the JSON log) in a file."""

    def __init__(self, module: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        self.log_file = open(log, "wb")
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=self.log_file,
            env=full_env,
        )

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        if not self.log_file.closed:
            self.log_file.flush()
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e.get("event") == event]

    def wait_event(self, event: str, timeout: float = 30.0, count: int = 1) -> list[dict[str, Any]]:
        return wait_for(
            lambda: len(self.named(event)) >= count and self.named(event),
            timeout=timeout,
            what=f"{count} {event!r} log line(s); log:\n{self.log()}",
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"daemon did not exit within {timeout}s; log:\n{self.log()}") from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log_file.close()


def scrape(port: int, timeout: float = 10.0) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """GET /metrics on localhost -> {sample name: {sorted label pairs: value}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(metrics: dict[str, Any], name: str, **labels: str) -> float | None:
    return metrics.get(name, {}).get(tuple(sorted(labels.items())))


def try_scrape(port: int) -> dict[str, Any] | None:
    try:
        return scrape(port, timeout=2.0)
    except OSError:
        return None


class WebhookSink:
    """A local HTTP server that records every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                data = self.rfile.read(length)
                sink.bodies.append({"path": self.path, **json.loads(data)})
                body = b'{"errcode": 0, "errmsg": "ok"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/robot/send?access_token=test"

    def alerts(self, status: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        out = []
        for b in self.bodies:
            a = b.get("alert", b)
            if (status is None or a.get("status") == status) and (kind is None or a.get("kind") == kind):
                out.append(b)
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def iter_lines(path: Path) -> Iterator[str]:
    yield from path.read_text(errors="replace").splitlines()
