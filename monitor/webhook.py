"""POSTing alerts to a webhook, in the background, with retries.

Formats:

- ``text`` (default): ``{"msgtype": "text", "text": {"content": "..."}}``, what
  DingTalk and WeCom group robots accept, with the machine-readable alert
  under ``"alert"`` as well;
- ``json``: the alert as a plain object.

With a DingTalk signing secret, ``timestamp`` and ``sign`` are added to the
URL (HMAC-SHA256 of "timestamp\\nsecret", base64, URL-encoded).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote_plus

import structlog

from .alerts import FIRING, Alert

__all__ = ["WebhookSender", "render", "signed_url"]

log = structlog.get_logger("monitor.webhook")


def render(alert: Alert, status: str, fmt: str, now_s: float | None = None) -> dict[str, Any]:
    """The JSON body for one notification."""
    ts = time.time() if now_s is None else now_s
    when = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = {
        "status": status,
        "kind": alert.kind,
        "crawl": alert.crawl,
        "subject": alert.subject,
        "value": alert.value,
        "threshold": alert.threshold,
        "summary": alert.summary,
        "ts": ts,
        "source": "streams-sched monitor",
    }
    if fmt == "json":
        return body
    tag = "FIRING" if status == FIRING else "RESOLVED"
    content = f"[{tag}] streams-sched: {alert.summary}\n{when}"
    return {"msgtype": "text", "text": {"content": content}, "alert": body}


def signed_url(url: str, secret: str, now_ms: int | None = None) -> str:
    """DingTalk's signed URL: adds ``timestamp`` and ``sign``."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    digest = hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()
    sign = quote_plus(base64.b64encode(digest).decode())
    return f"{url}{'&' if '?' in url else '?'}timestamp={ts}&sign={sign}"


class WebhookSender(threading.Thread):
    """Posts queued notifications; retries each up to ``attempts`` times with back-off."""

    def __init__(self, url: str, secret: str | None = None, timeout_s: float = 5.0, attempts: int = 4) -> None:
        super().__init__(name="streams-monitor-webhook", daemon=True)
        self.url = url
        self.secret = secret
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.sent = 0
        self.failed = 0

    def send(self, body: dict[str, Any]) -> None:
        self.queue.put(body)

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (up to ``timeout_s``), then stop."""
        self.queue.put(None)
        self.join(timeout_s)

    def run(self) -> None:
        while True:
            body = self.queue.get()
            if body is None:
                return
            self._post(body)

    def _post(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        delay = 1.0
        for attempt in range(1, self.attempts + 1):
            url = signed_url(self.url, self.secret) if self.secret else self.url
            request = urllib.request.Request(
                url, data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
                self.sent += 1
                log.info("alert_sent", kind=body.get("kind") or body.get("alert", {}).get("kind"), attempt=attempt)
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                log.warning("alert_send_failed", error=str(exc), attempt=attempt, of=self.attempts)
                if attempt < self.attempts:
                    time.sleep(delay)
                    delay *= 2
        self.failed += 1
        log.error("alert_dropped", body=body, hint="check --webhook-url")
