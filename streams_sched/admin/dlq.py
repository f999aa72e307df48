"""Dead letters: read them, put them back to work, or delete them.

A dead letter is an entry of a site's ``dlq`` stream with the fields ``r``
(the request payload), ``reason``, ``stream`` (the key it came from), ``id``
(its id there), ``deliveries``, ``node`` and ``ts`` (ms). Requeueing runs
``requeue_dead.lua`` per site (atomic: a letter is requeued at most once, even
by two operators at once); purging deletes the site's ``dlq`` key.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.replies import text

__all__ = ["DeadLetter", "iter_letters", "parse_letter", "purge_letters", "requeue_letters"]

#: Dead letters requeued per script call.
REQUEUE_CHUNK = 500



@dataclass(frozen=True, slots=True)
class DeadLetter:
    site: str
    id: str
    reason: str
    origin: str
    origin_id: str
    deliveries: int
    node: str
    ts_ms: int
    url: str | None
    payload: bytes

    @property
    def queue(self) -> str:
        """``task:band`` of the stream it came from, or the key's last part (e.g. ``delayed``)."""
        parts = self.origin.split(":")
        if len(parts) >= 3 and parts[-3] == "q":
            return f"{parts[-2]}:{parts[-1]}"
        return parts[-1] if parts else ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "id": self.id,
            "reason": self.reason,
            "queue": self.queue,
            "origin_id": self.origin_id,
            "deliveries": self.deliveries,
            "node": self.node,
            "ts_ms": self.ts_ms,
            "url": self.url,
        }


def url_of(payload: bytes) -> str | None:
    """The URL in a request payload, without building a Request (None if unreadable)."""
    try:
        d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:
        return None
    u = d.get("u") if isinstance(d, dict) else None
    return u if isinstance(u, str) else None


def parse_letter(site: str, entry_id: Any, fields: dict[Any, Any]) -> DeadLetter:
    f = {text(k): v for k, v in fields.items()}
    payload = f.get("r") or b""
    if isinstance(payload, str):
        payload = payload.encode()

    def num(name: str) -> int:
        try:
            return int(float(text(f.get(name, 0))))
        except ValueError:
            return 0

    return DeadLetter(
        site=site,
        id=text(entry_id),
        reason=text(f.get("reason", "")),
        origin=text(f.get("stream", "")),
        origin_id=text(f.get("id", "")),
        deliveries=num("deliveries"),
        node=text(f.get("node", "")),
        ts_ms=num("ts"),
        url=url_of(payload) if payload else None,
        payload=payload,
    )


def iter_letters(frontier: Frontier, site: str, batch: int = 500) -> Iterator[DeadLetter]:
    """Every dead letter of a site, oldest first, read in batches."""
    key = frontier.site(site).dlq
    start = "-"
    while True:
        rows = frontier.client.xrange(key, start, "+", count=batch) or []
        for entry_id, fields in rows:
            yield parse_letter(site, entry_id, fields or {})
        if len(rows) < batch:
            return
        start = "(" + text(rows[-1][0])


def requeue_letters(frontier: Frontier, site: str, ids: Sequence[str]) -> tuple[int, int, int]:
    """Requeue dead letters of one site by id. -> (requeued, kept, missing)."""
    total = [0, 0, 0]
    for i in range(0, len(ids), REQUEUE_CHUNK):
        counts = frontier.requeue_dead(site, ids[i : i + REQUEUE_CHUNK])
        for n in range(3):
            total[n] += counts[n]
    return total[0], total[1], total[2]


def purge_letters(frontier: Frontier, sites: Iterable[str], ids: Sequence[str] = ()) -> int:
    """Delete dead letters: the given ids of one site, or every letter of the sites. -> letters deleted."""
    sites = list(sites)
    client = frontier.client
    if ids:
        if len(sites) != 1:
            raise ValueError("deleting dead letters by id needs exactly one site")
        return int(client.xdel(frontier.site(sites[0]).dlq, *ids))
    pipe = client.pipeline(transaction=False)
    for s in sites:
        pipe.xlen(frontier.site(s).dlq)
        pipe.delete(frontier.site(s).dlq)
    replies = pipe.execute()
    return sum(int(n) for n in replies[0::2])
