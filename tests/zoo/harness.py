"""Running zoo crawls in subprocesses and reading what they recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo.site import ZooWeb

HERE = Path(__file__).resolve().parent.parent  # tests/
ROOT = HERE.parent


def zoo_settings(web: ZooWeb, out: Path, **extra: Any) -> dict[str, Any]:
    """Settings of a zoo crawl with Scrapy's own scheduler (add streams_settings() for streams-sched)."""
    settings: dict[str, Any] = {
        "ZOO_A": web.a,
        "ZOO_B": web.b,
        "ZOO_OUT": str(out),
        # Scrapy 2.13 reads DNS_RESOLVER; later releases TWISTED_DNS_RESOLVER
        "DNS_RESOLVER": "zoo.resolver.ZooResolver",
        "TWISTED_DNS_RESOLVER": "zoo.resolver.ZooResolver",
        "ITEM_PIPELINES": {"zoo.record.ZooRecordPipeline": 100},
        "EXTENSIONS": {"zoo.record.ZooStatsDump": 100, "scrapy.extensions.telnet.TelnetConsole": None},
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "DOWNLOAD_TIMEOUT": 20,
    }
    settings.update(extra)
    return settings


def streams_settings(redis_url: str, dedupe: str, **extra: Any) -> dict[str, Any]:
    """What a user adds to crawl through streams-sched (plus quick polling for tests)."""
    return {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "REDIS_URL": redis_url,
        "STREAMS_DEDUPE": dedupe,
        "STREAMS_IDLE_POLL_SECONDS": 0.2,
        "STREAMS_HEARTBEAT_SECONDS": 0.5,
        **extra,
    }


def env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "SCRAPY_SETTINGS_MODULE")}
    environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), environ.get("PYTHONPATH", "")])
    return environ


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def canonical(item: dict[str, Any]) -> str:
    return json.dumps(item, sort_keys=True)


@dataclass
class Batch:
    """One process that crawled some zoo spiders side by side."""

    out: Path
    returncode: int
    log: Path
    seconds: float

    def items(self, name: str) -> Counter[str]:
        """The spider's items (class and fields, JSON), as a multiset."""
        return Counter(canonical(r["item"]) for r in read_records(self.out / f"{name}.jsonl"))

    def stats(self, name: str) -> dict[str, Any]:
        path = self.out / f"{name}.stats.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def run_batch(settings: dict[str, Any], names: list[str], out: Path, timeout: float = 240) -> Batch:
    """Crawl ``names`` in one subprocess (``python -m zoo.run``), recording into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "crawl.log"
    started = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "zoo.run", json.dumps({**settings, "ZOO_OUT": str(out)}), *names],
            stdout=fh, stderr=subprocess.STDOUT, env=env(), cwd=out, timeout=timeout,
        )
    return Batch(out, proc.returncode, log, time.monotonic() - started)


def describe_difference(expected: Counter[str], got: Counter[str], limit: int = 6) -> str:
    missing = list((expected - got).elements())
    extra = list((got - expected).elements())
    lines = [f"{sum(expected.values())} items expected, {sum(got.values())} got;"
             f" {len(missing)} missing, {len(extra)} unexpected"]
    lines += ["  missing: " + m for m in missing[:limit]]
    lines += ["  unexpected: " + e for e in extra[:limit]]
    return "\n".join(lines)


ZOO_PROJECT_SETTINGS = """\
BOT_NAME = "zoo_project"
SPIDER_MODULES = ["zoo.spiders"]
DNS_RESOLVER = "zoo.resolver.ZooResolver"
TWISTED_DNS_RESOLVER = "zoo.resolver.ZooResolver"
ITEM_PIPELINES = {"zoo.record.ZooRecordPipeline": 100}
EXTENSIONS = {"zoo.record.ZooStatsDump": 100}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
"""


def scrapy_crawl(where: Path, spider: str, settings: dict[str, Any], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``scrapy crawl SPIDER -s NAME=VALUE ...`` in a fresh Scrapy project whose spiders are the zoo's."""
    pkg = where / "zoo_project"
    pkg.mkdir(parents=True, exist_ok=True)
    (where / "scrapy.cfg").write_text("[settings]\ndefault = zoo_project.settings\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(ZOO_PROJECT_SETTINGS)
    args = [sys.executable, "-m", "scrapy", "crawl", spider]
    for name, value in settings.items():
        text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        args += ["-s", f"{name}={text}"]
    environ = env()
    environ["PYTHONPATH"] = os.pathsep.join([str(where), environ["PYTHONPATH"]])
    return subprocess.run(args, cwd=where, env=environ, capture_output=True, text=True, timeout=timeout)
