"""A member of a site's delayed ZSET, ``<stream index>:<seq>:<payload>`` (lua/lib/delayed.lua),
read back: the tracked page it holds, if any.

A tracked page's payload has ``meta["_rv"]`` (worker/revisits.py), whose first value is
the page's interval in ms. Only msgpack is read: nothing from the payload is evaluated.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

__all__ = ["Waiting", "waiting_page"]


class Waiting(NamedTuple):
    """The tracked page a delayed member holds: its URL and interval (s)."""

    url: str
    interval_s: float


def waiting_page(member: bytes) -> Waiting | None:
    """The tracked page of a delayed member, or None (a plain delayed request, or unreadable)."""
    parts = member.split(b":", 2)
    if len(parts) != 3:
        return None
    try:
        d: Any = msgpack.unpackb(parts[2], raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - anything unreadable is not ours to read
        return None
    meta = d.get("mt") if isinstance(d, dict) else None
    state = meta.get("_rv") if isinstance(meta, dict) else None
    if not isinstance(state, list) or not state or not isinstance(state[0], (int, float)):
        return None
    return Waiting(str(d.get("u", "")), state[0] / 1000.0)
