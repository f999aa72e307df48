"""Dates, times and time zones in meta values: their extension data, both ways.

It owns the data of the extension codes 5-8 of :mod:`.values`::

    datetime   [y, mo, d, h, mi, s, us, fold(, tz)]
    date       [y, mo, d]
    time       [h, mi, s, us, fold(, tz)]
    timedelta  [days, seconds, microseconds]

    tz:  [0, offset_us, name or None]   a fixed offset (datetime.timezone; other tzinfos
                                         travel as their offset at that instant)
         [1, key, offset_us]             a zoneinfo.ZoneInfo; rebuilt from the zone file of
                                         the system TZPATH, else (or for a time) the offset

A zone is rebuilt only from a file under the system TZPATH, so decoding imports nothing.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
from typing import Any

from streams_sched.errors import EntryError

__all__ = ["Unencodable", "enc_datetime", "enc_time", "dec_datetime", "dec_date", "dec_time", "dec_timedelta"]

_US = dt.timedelta(microseconds=1)


class Unencodable(TypeError):
    """Raised inside packing for a value the codec cannot carry; says how to fix it."""


def _tz_spec(tz: dt.tzinfo, when: dt.datetime | None) -> list[Any]:
    key = getattr(tz, "key", None)
    offset = tz.utcoffset(when)
    if type(tz).__name__ == "ZoneInfo" and isinstance(key, str):
        return [1, key, None if offset is None else offset // _US]
    if offset is None:
        raise Unencodable(f"time zone {tz!r} has no UTC offset here")
    name = None
    if isinstance(tz, dt.timezone):
        named = tz.tzname(None)
        if named != dt.timezone(offset).tzname(None):
            name = named
    return [0, offset // _US, name]


_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")
_ZONE_KEYS: dict[str, bool] = {}


def _zone_on_disk(zoneinfo: Any, key: str) -> bool:
    """Whether ``key`` names a zone file under the system TZPATH (so ZoneInfo(key) reads that
    file and imports nothing); the key's shape admits no path tricks."""
    known = _ZONE_KEYS.get(key)
    if known is None:
        known = bool(_ZONE_KEY.fullmatch(key)) and any(
            os.path.isfile(os.path.join(root, key)) for root in zoneinfo.TZPATH
        )
        if len(_ZONE_KEYS) < 4096:
            _ZONE_KEYS[key] = known
    return known


def _zone(key: Any, offset_us: Any) -> dt.tzinfo:
    zoneinfo = sys.modules.get("zoneinfo")
    if zoneinfo is not None and isinstance(key, str) and _zone_on_disk(zoneinfo, key):
        try:
            tz: dt.tzinfo = zoneinfo.ZoneInfo(key)
            return tz
        except Exception:  # not a TZif file after all
            pass
    if not isinstance(offset_us, int):
        raise EntryError(f"time zone {key!r} is not known on this worker")
    return dt.timezone(dt.timedelta(microseconds=offset_us))


def _tz_from(spec: Any) -> dt.tzinfo:
    if not isinstance(spec, list) or len(spec) != 3:
        raise EntryError("time zone is not [kind, value, value]")
    kind, a, b = spec
    if kind == 1:
        return _zone(a, b)
    if kind == 0 and isinstance(a, int) and (b is None or isinstance(b, str)):
        offset = dt.timedelta(microseconds=a)
        return dt.timezone(offset) if b is None else dt.timezone(offset, b)
    raise EntryError(f"time zone kind {kind!r} is unknown")


def enc_datetime(v: dt.datetime) -> list[Any]:
    out: list[Any] = [v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, v.fold]
    if v.tzinfo is not None:
        out.append(_tz_spec(v.tzinfo, v))
    return out


def enc_time(v: dt.time) -> list[Any]:
    out: list[Any] = [v.hour, v.minute, v.second, v.microsecond, v.fold]
    if v.tzinfo is not None:
        out.append(_tz_spec(v.tzinfo, None))
    return out


def _ints(data: Any, n: int, what: str) -> list[int]:
    if not isinstance(data, list) or len(data) < n or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in data[:n]
    ):
        raise EntryError(f"{what} is not an array of {n} integers")
    return data


def dec_datetime(data: Any) -> dt.datetime:
    d = _ints(data, 8, "datetime")
    tz = _tz_from(d[8]) if len(d) == 9 else None
    return dt.datetime(d[0], d[1], d[2], d[3], d[4], d[5], d[6], tzinfo=tz, fold=d[7])


def dec_time(data: Any) -> dt.time:
    d = _ints(data, 5, "time")
    tz = _tz_from(d[5]) if len(d) == 6 else None
    return dt.time(d[0], d[1], d[2], d[3], tzinfo=tz, fold=d[4])


def dec_date(data: Any) -> dt.date:
    return dt.date(*_ints(data, 3, "date")[:3])


def dec_timedelta(data: Any) -> dt.timedelta:
    days, seconds, us = _ints(data, 3, "timedelta")[:3]
    return dt.timedelta(days=days, seconds=seconds, microseconds=us)
