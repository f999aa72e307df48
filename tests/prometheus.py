"""A real Prometheus server for the tests: it scrapes given targets, and answers PromQL."""

from __future__ import annotations

import json
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from streams_sched.testing import free_port

from helpers import find_tool, wait_for


class Prometheus:
    """``prometheus`` scraping ``targets`` (host:port) every ``interval``, on a free port, in a temporary directory.

    ``targets`` is one job's list, or a dict of job name -> targets for several jobs."""

    def __init__(self, targets: list[str] | dict[str, list[str]], job: str = "streams-monitor", interval: str = "1s") -> None:
        binary = find_tool("prometheus", "Debian's prometheus package")
        self.dir = Path(tempfile.mkdtemp(prefix="streams-sched-prometheus-"))
        self.port = free_port()
        jobs = targets if isinstance(targets, dict) else {job: targets}
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": name, "static_configs": [{"targets": t}]} for name, t in jobs.items()],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, timeout=30, what=f"prometheus on port {self.port}")

    def _ready(self) -> bool:
        assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (an error in the query raises)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single value ``promql`` evaluates to now (None: no sample)."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
