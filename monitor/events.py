"""Listening to the crawls' node events (pub/sub) on a background thread.

Workers publish ``node_online``, ``heartbeat`` and ``node_offline`` on
``ss:{crawl}:events``. The listener records, per crawl and node, when it last
heard from the node (the monitor's monotonic clock) and what it said. It
subscribes to the channel of every crawl the monitor watches, as they appear.
A user without pub/sub rights (the minimal read-only ACL) gets one warning and
the monitor goes on with the heartbeats recorded in the nodes hash.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from redis.exceptions import ResponseError

from streams_sched.connect.backoff import Backoff
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.service.daemon import TRANSIENT

__all__ = ["EventListener"]

log = structlog.get_logger("monitor.events")


class EventListener(threading.Thread):
    def __init__(self, client: Any, crawls: Callable[[], list[str]], max_backoff_s: float = 30.0) -> None:
        super().__init__(name="streams-monitor-events", daemon=True)
        self.client = client
        self.crawls = crawls
        self.max_backoff_s = max_backoff_s
        self.lock = threading.Lock()
        #: crawl -> node -> (time.monotonic() when heard, event name, heartbeat_s it gave)
        self.heard: dict[str, dict[str, tuple[float, str, float | None]]] = {}
        self.disabled = False
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def ages(self, crawl: str, now: float | None = None) -> dict[str, tuple[float, str, float | None]]:
        """node -> (seconds since heard, event, heartbeat_s) for one crawl."""
        now = time.monotonic() if now is None else now
        with self.lock:
            return {node: (now - t, ev, hb) for node, (t, ev, hb) in self.heard.get(crawl, {}).items()}

    def forget(self, crawl: str, nodes: set[str]) -> None:
        with self.lock:
            known = self.heard.get(crawl, {})
            for node in nodes:
                known.pop(node, None)

    def on_message(self, channel: str, data: Any) -> None:
        try:
            event = json.loads(data)
        except (TypeError, ValueError):
            return
        if not isinstance(event, dict):
            return
        node, name = event.get("node"), event.get("event")
        crawl = event.get("crawl") or _crawl_of(channel)
        if not isinstance(node, str) or not isinstance(name, str) or not crawl:
            return
        hb = event.get("heartbeat_s")
        with self.lock:
            self.heard.setdefault(crawl, {})[node] = (
                time.monotonic(), name, float(hb) if isinstance(hb, (int, float)) else None,
            )

    def run(self) -> None:
        backoff = Backoff(max_s=self.max_backoff_s)
        while not self._halt.is_set():
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            subscribed: set[str] = set()
            next_look = 0.0
            try:
                while not self._halt.is_set():
                    now = time.monotonic()
                    if now >= next_look:
                        want = {CrawlKeys(c).events for c in self.crawls()}
                        new = want - subscribed
                        if new:
                            pubsub.subscribe(*sorted(new))
                            subscribed |= new
                        next_look = now + 2.0
                    if not subscribed:
                        self._halt.wait(0.5)
                        continue
                    msg = pubsub.get_message(timeout=0.5)
                    if msg and msg.get("type") == "message":
                        ch = msg["channel"]
                        self.on_message(ch.decode() if isinstance(ch, bytes) else ch, msg["data"])
                    if backoff.since is not None:
                        log.info("events_resumed", after_s=round(backoff.reset(), 1))
            except ResponseError as exc:
                if "NOPERM" in str(exc) or "permission" in str(exc).lower():
                    log.warning(
                        "events_disabled",
                        error=str(exc),
                        hint="liveness comes from the nodes hash only; allow +subscribe &ss:* for events",
                    )
                    self.disabled = True
                    return
                delay = backoff.next()
                log.warning("events_error", error=str(exc), retry_in_s=delay)
                self._halt.wait(delay)
            except TRANSIENT as exc:
                delay = backoff.next()
                log.warning("events_unreachable", error=str(exc), retry_in_s=delay)
                self._halt.wait(delay)
            finally:
                try:
                    pubsub.close()
                except Exception:
                    pass


def _crawl_of(channel: str) -> str | None:
    start, end = channel.find("{"), channel.rfind("}")
    return channel[start + 1 : end] if 0 <= start < end else None
