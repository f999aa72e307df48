"""Item pipelines for tests and the demo."""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["RecordPipeline"]


class RecordPipeline:
    """Appends one JSON line per item to ``RECORD_FILE`` with one ``write`` call,
    unbuffered, so every line written survives a SIGKILL of the worker."""

    def __init__(self, path: str | os.PathLike[str], tag: str) -> None:
        self.path = path
        self.tag = tag
        self.fd = -1

    @classmethod
    def from_crawler(cls, crawler: Any) -> RecordPipeline:
        return cls(crawler.settings.get("RECORD_FILE", "items.jsonl"), crawler.settings.get("RECORD_TAG", ""))

    def open_spider(self, spider: Any = None) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def close_spider(self, spider: Any = None) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def process_item(self, item: Any, spider: Any = None) -> Any:
        os.write(self.fd, (self.line(item) + "\n").encode())
        return item

    def line(self, item: Any) -> str:
        """The JSON line recorded for ``item``."""
        return json.dumps({**dict(item), "worker": self.tag, "ts": time.time()}, sort_keys=True)
