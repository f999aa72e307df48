"""How a zoo crawl is recorded: every item as one JSON line (with its class), and the
crawl's final stats, in ``ZOO_OUT/<spider name>.jsonl`` and ``.stats.json``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from itemadapter import ItemAdapter
from scrapy import signals

from streams_sched.demo.pipelines import RecordPipeline


def typed(value: Any) -> Any:
    """A JSON description of ``value`` that keeps its type, at any depth: two values
    describe alike only if they are equal and of the same types. Plain JSON types stay
    as they are (str subclasses, such as lxml's smart strings, count as str); others
    become ``{"__type__": ...}``."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: typed(v) for k, v in value.items()}
        return {"__dict__": sorted(([typed(k), typed(v)] for k, v in value.items()), key=repr)}
    if isinstance(value, tuple):
        return {f"__{type(value).__qualname__}__": [typed(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {f"__{type(value).__qualname__}__": sorted((typed(v) for v in value), key=repr)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f"__{type(value).__qualname__}__": typed({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})}
    if ItemAdapter.is_item(value):
        return {f"__{type(value).__qualname__}__": typed(ItemAdapter(value).asdict())}
    return {f"__{type(value).__module__}.{type(value).__qualname__}__": repr(value)}


def out_dir(settings: Any) -> Path:
    path = Path(settings.get("ZOO_OUT") or ".")
    path.mkdir(parents=True, exist_ok=True)
    return path


class ZooRecordPipeline(RecordPipeline):
    """One line per item: its class and its fields, appended with one write (survives SIGKILL)."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> ZooRecordPipeline:
        assert crawler.spidercls is not None
        path = out_dir(crawler.settings) / f"{crawler.spidercls.name}.jsonl"
        return cls(path, str(crawler.settings.get("RECORD_TAG", "")))

    def line(self, item: Any) -> str:
        fields = dict(ItemAdapter(item).items())
        record = {"item_class": type(item).__qualname__, **{k: typed(v) for k, v in fields.items()}}
        return json.dumps({"item": record, "worker": self.tag}, sort_keys=True)


class ZooStatsDump:
    """Writes the crawl's stats and close reason when the spider closes."""

    def __init__(self, crawler: Any) -> None:
        self.crawler = crawler
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ZooStatsDump:
        return cls(crawler)

    def spider_closed(self, spider: Any, reason: str) -> None:
        stats = dict(self.crawler.stats.get_stats())
        stats["zoo/close_reason"] = reason
        path = out_dir(self.crawler.settings) / f"{spider.name}.stats.json"
        path.write_text(json.dumps(stats, default=str, sort_keys=True))
