"""Payloads of many GET requests that differ only by their URL, packed once.

A seeder sends many requests with the same callback, meta and priority. The payload of
each is the payload :meth:`.RequestCodec.encode` gives, byte for byte, built from a
template packed once with an empty URL: a msgpack map is its header and then its pairs in
order, "u" first, so what follows the empty URL is every URL's tail.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from streams_sched.errors import SerializationError
from streams_sched.wire.schema import size_message, with_version, without_transient

if TYPE_CHECKING:
    from streams_sched.wire.codec import RequestCodec

__all__ = ["url_encoder"]

_EMPTY_URL = b"\xa1u\xa0"  # msgpack of "u" and of ""


class Named:
    """Stands for a request in an error message: its repr is the text given."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def url_encoder(
    codec: RequestCodec,
    *,
    callback: str | None = None,
    errback: str | None = None,
    meta: Mapping[str, Any] | None = None,
    priority: int = 0,
    dont_filter: bool = False,
) -> Callable[[str], bytes]:
    """See :meth:`.RequestCodec.url_encoder`."""
    d: dict[str, Any] = {"u": ""}
    v2 = False
    for key, name in (("c", callback), ("e", errback)):
        if name is not None:
            d[key] = name
            v2 = v2 or name[:1] == "_"
    if meta:
        d["mt"] = dict(without_transient(meta))
    if priority:
        d["p"] = priority
    if dont_filter:
        d["df"] = True
    values = codec.values
    values.ext_used = False
    try:
        template = values.pack(d)
    except Exception as exc:
        raise codec.explain(Named("<GET (each URL)>"), d, exc) from None
    v2 = v2 or values.ext_used
    if template[1:4] != _EMPTY_URL:  # pragma: no cover - the template is a fixmap with "u" first
        raise AssertionError(f"unexpected payload template {template[:8]!r}")
    head = (with_version(template[:1]) if v2 else template[:1]) + b"\xa1u"
    tail = template[4:]
    pack_str = msgpack.Packer(use_bin_type=True).pack
    max_bytes = codec.max_bytes

    def encode_url(url: str) -> bytes:
        payload: bytes = head + pack_str(url) + tail
        if max_bytes and len(payload) > max_bytes:
            raise SerializationError(f"<GET {url}>", "size", size_message(len(payload), max_bytes))
        return payload

    return encode_url
