"""The lines of a dump: what each holds, written as JSON and read back (pure, no I/O).

A dump is JSON Lines (docs/operations/data.md)::

    {"streams_sched_dump": {...}}                  the header: format, crawl, source, Redis TIME, ...
    {"site": {"name": ..., "policy": {...}}}       a site's policy, before its requests
    {"discovered": {"info": {...}}}                a request due now (queued, or leased at the dump)
    {"known": {"info": {...}, "refetchable_from_date": "..."}}
                                                   a request that waits (delayed, tracked), or a
                                                   dead letter (no date: done)
    {"site_state": {"name": ..., ...}}             a site's counters and seen filters, after its requests
    {"streams_sched_end": {...}}                   the last line: counts (a file without it is cut short)

A request line is a url-frontier ``URLItem`` (crawler-commons/url-frontier's API, whose
``DumpURLs`` writes and ``PutURLs`` reads these lines): ``info.url`` the URL, ``info.key``
the site (url-frontier's queue key), ``info.crawlID`` the crawl, ``refetchable_from_date``
the next fetch (epoch seconds), and streams-sched's own fields in ``info.metadata`` as string
lists under ``ss.*`` names, so that url-frontier keeps them. :class:`RequestLine` is one
request; :func:`request_fields` and :func:`payload_of` turn a payload into the JSON of its
fields (``ss.request``) and back, exactly (jsonvalues.py for the values).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from streams_sched.frontier.delayed import waiting_page
from streams_sched.frontier.keys import BANDS, STREAMS, TASK_TYPES
from streams_sched.transfer.jsonvalues import JsonValueError, from_json, pack, to_json, unpack

__all__ = [
    "FORMAT", "BadRecord", "DeadInfo", "End", "Header", "LeaseInfo", "Record", "RequestLine", "SiteLine", "SiteState",
    "parse_record", "payload_of", "queue_name", "request_fields", "stream_of_queue",
]

#: the dump format this code writes and reads
FORMAT = 1
#: the state of a request in a dump
STATES = ("queued", "delayed", "tracked", "dead")
#: the first key of each kind of line
HEADER_KEY, SITE_KEY, STATE_KEY, END_KEY = "streams_sched_dump", "site", "site_state", "streams_sched_end"
#: metadata names (ss.*) that carry streams-sched's fields; the version of their layout
SS = "ss."
SS_VERSION = "1"

#: payload keys (wire/schema.py) and their names in a dump's ``ss.request``, in no order:
#: a dump keeps the payload's own order
PAYLOAD_NAMES: dict[str, str] = {
    "v": "schema", "c": "callback", "e": "errback", "m": "method", "h": "headers", "b": "body", "k": "cookies",
    "mt": "meta", "a": "cb_kwargs", "p": "priority", "df": "dont_filter", "en": "encoding", "f": "flags",
    "t": "class", "x": "attributes",
}
_PAYLOAD_KEYS = {name: key for key, name in PAYLOAD_NAMES.items()}
#: a payload key this version does not name is written as "~<key>"
_UNNAMED = "~"
#: JSON as a dump writes it: no spaces, text as it is (one encoder, made once)
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class BadRecord(ValueError):
    """A line that is no line of a dump, with the reason (the loader adds the line number)."""


def queue_name(stream: int) -> str:
    """``task:band`` of a stream index."""
    task, band = STREAMS[stream]
    return f"{task}:{band}"


def stream_of_queue(name: str) -> int:
    """The stream index of ``task:band``; BadRecord for another name."""
    task, _, band = name.partition(":")
    if task not in TASK_TYPES or band not in BANDS:
        raise BadRecord(f"queue {name!r} is none of {[queue_name(i) for i in range(len(STREAMS))]}")
    return STREAMS.index((task, band))


# -- a payload's fields as JSON, and back ---------------------------------------------------

def _bytes_text(data: Any) -> Any:
    """Bytes a request field always holds (headers, body) as text when they are UTF-8."""
    if isinstance(data, bytes):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes": base64.b64encode(data).decode("ascii")}
    return {"$str": data} if isinstance(data, str) else to_json(data)


def _text_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and len(value) == 1 and "$str" in value and isinstance(value["$str"], str):
        return value["$str"]
    return from_json(value)


def _headers_json(headers: Any) -> Any:
    if isinstance(headers, list) and all(isinstance(h, list) and len(h) == 2 and isinstance(h[1], list) for h in headers):
        return [[_bytes_text(name), [_bytes_text(v) for v in values]] for name, values in headers]
    return {"$raw": to_json(headers)}


def _headers_value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$raw"}:
        return from_json(value["$raw"])
    if not isinstance(value, list) or not all(isinstance(h, list) and len(h) == 2 and isinstance(h[1], list)
                                              for h in value):
        raise BadRecord("headers are not a list of [name, [values]]")
    return [[_text_bytes(name), [_text_bytes(v) for v in values]] for name, values in value]


def request_fields(payload: bytes) -> tuple[dict[str, Any], str] | None:
    """(the JSON of a payload's fields but its URL, in its order; the URL), or None when the
    payload is no map with a URL that this can write exactly (the dump then carries the
    payload itself)."""
    try:
        d = unpack(payload)
    except Exception:  # noqa: BLE001 - anything unreadable is carried as it is
        return None
    if not isinstance(d, dict) or not isinstance(d.get("u"), str):
        return None
    out: dict[str, Any] = {}
    try:
        for key, value in d.items():
            if key == "u":
                continue
            if not isinstance(key, str):
                return None
            name = PAYLOAD_NAMES.get(key)
            if name == "headers":
                out[name] = _headers_json(value)
            elif name == "body":
                out[name] = _bytes_text(value)
            else:
                out[name if name is not None else _UNNAMED + key] = to_json(value)
    except JsonValueError:
        return None
    return out, d["u"]


def payload_of(url: str, fields: Mapping[str, Any]) -> bytes:
    """The payload of ``request_fields``' JSON: the schema version first when there is one,
    then the URL, then the fields in their order. BadRecord for a field that means nothing."""
    d: dict[str, Any] = {}
    if "schema" in fields:
        d["v"] = from_json(fields["schema"])
    d["u"] = url
    try:
        for name, value in fields.items():
            if name == "schema":
                continue
            key = _PAYLOAD_KEYS.get(name)
            if key is None:
                if not name.startswith(_UNNAMED) or len(name) == 1:
                    raise BadRecord(f"ss.request has the unknown field {name!r}")
                key = name[1:]
            if key == "h":
                d[key] = _headers_value(value)
            elif key == "b":
                d[key] = _text_bytes(value)
            else:
                d[key] = from_json(value)
    except JsonValueError as exc:
        raise BadRecord(f"ss.request: {exc}") from None
    return pack(d)


# -- the lines ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Header:
    """The first line: what was dumped, from where, when (Redis TIME), and how it dedupes."""

    crawl: str
    time_ms: int
    dump_id: str
    source: str = ""
    server: str = ""
    shards: int = 0
    site_key: str = "host"
    #: the crawl's dedupe back-end and sizing (meta fields dedupe, bloom_*, revisit_*)
    dedupe: dict[str, str] = field(default_factory=dict)
    #: the crawl's default policy (meta fields default_*)
    defaults: dict[str, str] = field(default_factory=dict)
    revisits_stopped: bool = False
    #: whether site_state lines carry the seen filters
    seen: bool = False
    #: the sites asked for (None: all)
    sites: tuple[str, ...] | None = None
    version: str = ""

    def line(self) -> str:
        body: dict[str, Any] = {
            "format": FORMAT, "crawl": self.crawl, "time_ms": self.time_ms, "dump_id": self.dump_id,
            "source": self.source, "server": self.server, "shards": self.shards, "site_key": self.site_key,
            "dedupe": self.dedupe, "defaults": self.defaults, "revisits_stopped": self.revisits_stopped,
            "seen": self.seen, "sites": list(self.sites) if self.sites is not None else None, "written_by": self.version,
        }
        return json.dumps({HEADER_KEY: body}, separators=(",", ":"))

    @classmethod
    def read(cls, body: Any) -> Header:
        if not isinstance(body, dict):
            raise BadRecord("the header is not an object")
        fmt = body.get("format")
        if fmt != FORMAT:
            raise BadRecord(
                f"dump format {fmt!r}: this streams-sched reads format {FORMAT}"
                + ("; upgrade streams-sched to read it" if isinstance(fmt, int) and fmt > FORMAT else "")
            )
        try:
            sites = body.get("sites")
            return cls(
                crawl=_text(body, "crawl"), time_ms=int(body["time_ms"]), dump_id=_text(body, "dump_id"),
                source=str(body.get("source", "")), server=str(body.get("server", "")),
                shards=int(body.get("shards") or 0), site_key=str(body.get("site_key") or "host"),
                dedupe={str(k): str(v) for k, v in (body.get("dedupe") or {}).items()},
                defaults={str(k): str(v) for k, v in (body.get("defaults") or {}).items()},
                revisits_stopped=bool(body.get("revisits_stopped")), seen=bool(body.get("seen")),
                sites=tuple(str(s) for s in sites) if isinstance(sites, list) else None,
                version=str(body.get("written_by", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadRecord(f"the header is incomplete ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class SiteLine:
    """A site's policy (the fields of politeness/policy.py's POLICY_FIELDS, as stored)."""

    site: str
    policy: dict[str, str]

    def line(self) -> str:
        return json.dumps({SITE_KEY: {"name": self.site, "policy": self.policy}}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class SeenKey:
    """One key of a site's seen filters: its name after the site's (``seen``, ``seen:meta``,
    ``seen:<bucket>``...), type, TTL and value (see scripts/read_site.py's FilterValue)."""

    suffix: str
    kind: str
    pttl_ms: int
    value: Any

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.suffix, "type": self.kind, "pttl_ms": self.pttl_ms}
        if self.kind == "string":
            out["data"] = base64.b64encode(self.value).decode("ascii")
        elif self.kind == "hash":
            out["fields"] = {_t(k): _t(v) for k, v in zip(self.value[::2], self.value[1::2], strict=True)}
        else:
            out["chunks"] = [[int(self.value[i]), base64.b64encode(self.value[i + 1]).decode("ascii")]
                             for i in range(0, len(self.value), 2)]
        return out

    @classmethod
    def read(cls, obj: Any) -> SeenKey:
        try:
            suffix, kind, pttl = str(obj["key"]), str(obj["type"]), int(obj.get("pttl_ms", -1))
            if not (suffix == "seen" or suffix.startswith("seen:")):
                raise BadRecord(f"seen key {suffix!r} is no seen filter's")
            if kind == "string":
                return cls(suffix, kind, pttl, base64.b64decode(obj["data"], validate=True))
            if kind == "hash":
                return cls(suffix, kind, pttl, {str(k): str(v) for k, v in obj["fields"].items()})
            chunks = [(int(i), base64.b64decode(d, validate=True)) for i, d in obj["chunks"]]
            return cls(suffix, kind, pttl, chunks)
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
            raise BadRecord(f"a seen filter key is incomplete ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, slots=True)
class SiteState:
    """A site's counters a load restores (pages accepted under a cap, tracked pages and
    their demand and stretch) and its seen filters (with ``dump --seen``)."""

    site: str
    stats: dict[str, str]
    seen: tuple[SeenKey, ...] = ()

    def line(self) -> str:
        body: dict[str, Any] = {"name": self.site, "stats": self.stats}
        if self.seen:
            body["seen"] = [k.as_json() for k in self.seen]
        return json.dumps({STATE_KEY: body}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class End:
    """The last line: how many lines of each kind the dump wrote."""

    requests: int
    sites: int
    journal: int
    lines: int
    time_ms: int

    def line(self) -> str:
        return json.dumps({END_KEY: {"requests": self.requests, "sites": self.sites, "journal": self.journal,
                                     "lines": self.lines, "time_ms": self.time_ms}}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class LeaseInfo:
    """Who held a request leased at the dump, for how long then, after how many deliveries."""

    node: str
    held_ms: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class DeadInfo:
    """A dead letter's record: why, after how many deliveries, which node, when (ms), its id
    where it came from, and the key it came from when that is no stream of its site."""

    reason: str
    deliveries: int = 0
    node: str = ""
    ts_ms: int = 0
    origin_id: str = ""
    origin: str = ""


@dataclass(slots=True)
class RequestLine:
    """One request of a dump. ``payload`` is its exact payload; ``stream`` its stream index;
    ``due_in_ms`` when it is due counted from the dump's time (delayed, tracked);
    ``deliveries`` its earlier failed deliveries."""

    site: str
    url: str
    state: str
    stream: int
    payload: bytes
    due_in_ms: int = 0
    deliveries: int = 0
    lease: LeaseInfo | None = None
    dead: DeadInfo | None = None
    #: url-frontier's own line (no ss.* fields): its metadata, and whether it was done
    #: (known, refetchable_from_date 0)
    foreign: dict[str, list[str]] | None = None
    done: bool = False
    crawl: str = ""
    #: url-frontier's refetchable_from_date (epoch s) of a foreign line, 0 none
    refetch_s: int = 0

    def line(self, crawl: str, time_ms: int) -> str:
        """The line of this request in a dump of ``crawl`` taken at ``time_ms`` (its URL is the
        payload's when ``url`` is empty)."""
        meta: dict[str, Any] = {"ss.v": [SS_VERSION], "ss.state": [self.state], "ss.queue": [queue_name(self.stream)]}
        fields = request_fields(self.payload)
        if fields is not None and not self.url:
            self.url = fields[1]
        if fields is not None and fields[1] == self.url and _exact(self.url, fields[0], self.payload):
            meta["ss.request"] = [_compact(fields[0]) if fields[0] else "{}"]
        else:
            meta["ss.payload"] = [base64.b64encode(self.payload).decode("ascii")]
        if self.state in ("delayed", "tracked"):
            meta["ss.due_in_ms"] = [str(self.due_in_ms)]
        if self.deliveries:
            meta["ss.deliveries"] = [str(self.deliveries)]
        if self.lease is not None:
            meta["ss.leased_by"] = [self.lease.node]
            meta["ss.leased_for_ms"] = [str(self.lease.held_ms)]
            meta["ss.lease_deliveries"] = [str(self.lease.deliveries)]
        if self.dead is not None:
            d = self.dead
            meta["ss.dead_reason"] = [d.reason]
            meta["ss.dead_deliveries"] = [str(d.deliveries)]
            meta["ss.dead_node"] = [d.node]
            meta["ss.dead_at_ms"] = [str(d.ts_ms)]
            meta["ss.dead_id"] = [d.origin_id]
            if d.origin:
                meta["ss.dead_origin"] = [d.origin]
        info = {"url": self.url, "key": self.site,
                "metadata": {k: {"values": v} for k, v in meta.items()}, "crawlID": crawl}
        if self.state == "queued":
            item: dict[str, Any] = {"discovered": {"info": info}}
        elif self.state == "dead":
            item = {"known": {"info": info}}
        else:
            when = math.ceil((time_ms + self.due_in_ms) / 1000)
            item = {"known": {"info": info, "refetchable_from_date": str(max(1, when))}}
        return _compact(item)

    @property
    def tracked(self) -> bool:
        return self.state == "tracked"


def tracked_state(state: str, stream: int, payload: bytes) -> str:
    """'tracked' for a waiting request that is a tracked page, else ``state``."""
    if state == "delayed" and waiting_page(b"%d::%b" % (stream + 1, payload)) is not None:
        return "tracked"
    return state


def _exact(url: str, fields: dict[str, Any], payload: bytes) -> bool:
    if not fields:
        return pack({"u": url}) == payload
    try:
        return payload_of(url, fields) == payload
    except (BadRecord, ValueError, TypeError, OverflowError):
        return False


def _t(v: Any) -> str:
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRecord(f"the header has no {name}")
    return value


# -- reading a line -------------------------------------------------------------------------

Record = Header | SiteLine | SiteState | RequestLine | End


def parse_record(obj: Any) -> Record:
    """The record of one line's JSON value; BadRecord with the reason for anything else."""
    if not isinstance(obj, dict) or not obj:
        raise BadRecord("the line is no JSON object")
    if HEADER_KEY in obj:
        return Header.read(obj[HEADER_KEY])
    if SITE_KEY in obj and len(obj) == 1:
        body = obj[SITE_KEY]
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(body.get("policy"), dict):
            raise BadRecord("a site line has no name or policy")
        return SiteLine(body["name"], {str(k): str(v) for k, v in body["policy"].items()})
    if STATE_KEY in obj and len(obj) == 1:
        body = obj[STATE_KEY]
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise BadRecord("a site_state line has no name")
        stats = body.get("stats") or {}
        if not isinstance(stats, dict):
            raise BadRecord("a site_state line's stats are no object")
        seen = body.get("seen") or []
        if not isinstance(seen, list):
            raise BadRecord("a site_state line's seen is no list")
        return SiteState(body["name"], {str(k): str(v) for k, v in stats.items()}, tuple(SeenKey.read(s) for s in seen))
    if END_KEY in obj:
        body = obj[END_KEY]
        try:
            return End(int(body["requests"]), int(body["sites"]), int(body["journal"]), int(body["lines"]),
                       int(body["time_ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadRecord(f"the end line is incomplete ({exc})") from None
    if "discovered" in obj or "known" in obj:
        return _request(obj)
    raise BadRecord(f"unknown line (its keys: {sorted(obj)[:5]})")


def _values(metadata: Any, check: bool = True) -> dict[str, list[str]]:
    """url-frontier's metadata (name -> {"values": [...]}) as name -> list of strings (with
    ``check``: each value checked; without, the caller checks the values it reads)."""
    if metadata is None:
        return {}
    try:
        out = {name: value["values"] for name, value in metadata.items()}
    except (AttributeError, TypeError, KeyError):
        if not isinstance(metadata, dict):
            raise BadRecord("info.metadata is no object") from None
        out = {name: value.get("values", []) if isinstance(value, dict) else None for name, value in metadata.items()}
    if check or any(type(v) is not list for v in out.values()):
        for name, values in out.items():
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise BadRecord(f"info.metadata[{name!r}] is no {{\"values\": [strings]}}")
    return out


def _one(meta: Mapping[str, list[str]], name: str, default: str | None = None) -> str:
    values = meta.get(name)
    if not values:
        if default is None:
            raise BadRecord(f"{name} is missing")
        return default
    value = values[0]
    if type(value) is not str:
        raise BadRecord(f"info.metadata[{name!r}] is no {{\"values\": [strings]}}")
    return value


def _int(meta: Mapping[str, list[str]], name: str, default: int = 0) -> int:
    raw = _one(meta, name, str(default))
    try:
        return int(raw)
    except ValueError:
        raise BadRecord(f"{name} is {raw!r}, not a whole number") from None


def _request(obj: dict[str, Any]) -> RequestLine:
    known = "known" in obj
    item = obj["known" if known else "discovered"]
    if not isinstance(item, dict) or not isinstance(item.get("info"), dict):
        raise BadRecord("a request line has no info")
    info = item["info"]
    url = info.get("url", "")
    if not isinstance(url, str):
        raise BadRecord("info.url is no string")
    site = info.get("key") or ""
    crawl = info.get("crawlID") or ""
    if not isinstance(site, str) or not isinstance(crawl, str):
        raise BadRecord("info.key and info.crawlID must be strings")
    meta = _values(info.get("metadata"), check=False)
    refetch = item.get("refetchable_from_date", item.get("refetchableFromDate", 0)) if known else 0
    try:
        refetch_s = int(refetch or 0)
    except (TypeError, ValueError):
        raise BadRecord(f"refetchable_from_date {refetch!r} is no number of seconds") from None
    if "ss.v" not in meta:
        # url-frontier's own line: the URL, its queue key, its metadata
        if not url:
            raise BadRecord("info.url is empty")
        meta = _values(info.get("metadata"))
        ss = {k: v for k, v in meta.items() if k.startswith(SS)}
        if ss:
            raise BadRecord(f"{sorted(ss)[0]} without ss.v")
        return RequestLine(site, url, "queued" if not known or refetch_s else "dead", 0, b"", foreign=meta,
                           done=known and not refetch_s, crawl=crawl, refetch_s=refetch_s)
    version = _one(meta, "ss.v")
    if version != SS_VERSION:
        raise BadRecord(f"ss.v {version!r}: this streams-sched reads request fields version {SS_VERSION}")
    state = _one(meta, "ss.state")
    if state not in STATES:
        raise BadRecord(f"ss.state {state!r} is none of {list(STATES)}")
    stream = stream_of_queue(_one(meta, "ss.queue"))
    if "ss.payload" in meta:
        try:
            payload = base64.b64decode(_one(meta, "ss.payload"), validate=True)
        except (binascii.Error, ValueError):
            raise BadRecord("ss.payload is not base64") from None
    else:
        if not url:
            raise BadRecord("info.url is empty")
        text = _one(meta, "ss.request", "{}")
        if text == "{}":
            payload = pack({"u": url})
        else:
            try:
                fields = json.loads(text)
            except ValueError as exc:
                raise BadRecord(f"ss.request is not JSON ({exc})") from None
            if not isinstance(fields, dict):
                raise BadRecord("ss.request is no object")
            payload = payload_of(url, fields)
    dead = None
    if state == "dead":
        dead = DeadInfo(_one(meta, "ss.dead_reason", ""), _int(meta, "ss.dead_deliveries"), _one(meta, "ss.dead_node", ""),
                        _int(meta, "ss.dead_at_ms"), _one(meta, "ss.dead_id", ""), _one(meta, "ss.dead_origin", ""))
    elif not url:
        raise BadRecord("info.url is empty")
    lease = None
    if "ss.leased_by" in meta:
        lease = LeaseInfo(_one(meta, "ss.leased_by"), _int(meta, "ss.leased_for_ms"), _int(meta, "ss.lease_deliveries"))
    return RequestLine(site, url, state, stream, payload, _int(meta, "ss.due_in_ms"), _int(meta, "ss.deliveries"),
                       lease, dead, crawl=crawl, refetch_s=refetch_s)
