"""msgpack values <-> JSON, exactly, for the values a dump writes of a request.

A payload's meta, cb_kwargs, cookies and the rest are msgpack (wire/values.py): bytes,
extension types, maps with keys that are not strings. JSON has none of these, so each is
an object with one key that starts with ``$``::

    {"$bytes": "<base64>"}                msgpack bin
    {"$float": "nan" | "inf" | "-inf"}    a float JSON cannot write
    {"$map": [[key, value], ...]}         a map with a key that is not a string, or starts with $
    {"$tuple": [...]}  {"$set": [...]}  {"$frozenset": [...]}       extension codes 1-3
    {"$datetime": v}  {"$date": v}  {"$time": v}  {"$timedelta": v}  codes 5-8 (v: their fields)
    {"$decimal": "1.50"}                  code 9
    {"$uuid": "0b6e..."}                  code 10
    {"$class": [module, qualname, state]} code 16: named, never looked up or imported here
    {"$codec": [name, data]}              code 17
    {"$ext": [code, "<base64>"]}          any other code

Everything else is JSON's own. :func:`to_json` reads what ``msgpack.unpackb`` gives with
extension values left as ``msgpack.ExtType`` (:func:`unpack`), :func:`from_json` gives it
back, so packing it again gives the same bytes for anything msgpack-python packed (each
value in its shortest form, as wire/values.py packs). Nothing here builds an object of a
class a value names: a dump or a load never evaluates or imports what it reads.
"""

from __future__ import annotations

import base64
import binascii
import math
import uuid
from collections.abc import Callable
from typing import Any

import msgpack

__all__ = ["JsonValueError", "from_json", "pack", "to_json", "unpack"]

#: extension codes whose data is one msgpack value (wire/values.py), by tag
_PACKED = {1: "$tuple", 2: "$set", 3: "$frozenset", 5: "$datetime", 6: "$date", 7: "$time", 8: "$timedelta",
           16: "$class", 17: "$codec"}
_PACKED_CODE = {tag: code for code, tag in _PACKED.items()}
_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_MAX_DEPTH = 128


class JsonValueError(ValueError):
    """A JSON value that is no value of a dump (an unknown ``$`` tag, bad base64, ...)."""


def _ext(code: int, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, data)


def unpack(data: bytes) -> Any:
    """msgpack as plain Python, extension values as ``ExtType``, strings decoded (a string
    that is not UTF-8 raises UnicodeDecodeError)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext)


def pack(value: Any) -> bytes:
    """msgpack of ``value`` as wire/values.py packs it (bin for bytes)."""
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise JsonValueError(f"expected base64 text, not {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise JsonValueError(f"{text[:40]!r} is not base64") from None


def to_json(value: Any, depth: int = 0) -> Any:
    """The JSON form of an unpacked msgpack value (see the module docstring)."""
    if depth > _MAX_DEPTH:
        raise JsonValueError(f"values nest deeper than {_MAX_DEPTH}")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, bytes):
        return {"$bytes": _b64(value)}
    if isinstance(value, list):
        return [to_json(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: to_json(v, depth + 1) for k, v in value.items()}
        return {"$map": [[to_json(k, depth + 1), to_json(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, msgpack.ExtType):
        return _ext_json(value, depth)
    raise JsonValueError(f"{type(value).__name__} is no msgpack value")


def _ext_json(ext: msgpack.ExtType, depth: int) -> Any:
    code, data = ext.code, ext.data
    tag = _PACKED.get(code)
    if tag is not None:
        try:
            return {tag: to_json(unpack(data), depth + 1)}
        except (ValueError, msgpack.UnpackException):
            pass  # not what the code says: kept as bytes
    elif code == 9:
        try:
            return {"$decimal": data.decode("utf-8")}
        except UnicodeDecodeError:
            pass
    elif code == 10 and len(data) == 16:
        return {"$uuid": str(uuid.UUID(bytes=data))}
    return {"$ext": [code, _b64(data)]}


def _one_tag(value: dict[str, Any]) -> str | None:
    if len(value) == 1:
        (key,) = value
        if key.startswith("$"):
            return key
    return None


def from_json(value: Any, depth: int = 0) -> Any:
    """The msgpack value (plain Python, ``ExtType``) of a JSON form; JsonValueError for one
    :func:`to_json` never writes."""
    if depth > _MAX_DEPTH:
        raise JsonValueError(f"values nest deeper than {_MAX_DEPTH}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [from_json(v, depth + 1) for v in value]
    if not isinstance(value, dict):
        raise JsonValueError(f"{type(value).__name__} is no JSON value")
    tag = _one_tag(value)
    if tag is None:
        bad = [k for k in value if k.startswith("$")]
        if bad:
            raise JsonValueError(f"unknown tag {bad[0]!r} in an object of {len(value)} keys")
        return {k: from_json(v, depth + 1) for k, v in value.items()}
    inner = value[tag]
    decode = _TAGS.get(tag)
    if decode is None:
        raise JsonValueError(f"unknown tag {tag!r}")
    return decode(inner, depth)


def _map(inner: Any, depth: int) -> dict[Any, Any]:
    if not isinstance(inner, list) or not all(isinstance(p, list) and len(p) == 2 for p in inner):
        raise JsonValueError("$map is not a list of [key, value]")
    out: dict[Any, Any] = {}
    for k, v in inner:
        key = from_json(k, depth + 1)
        if isinstance(key, (list, dict)):
            raise JsonValueError("$map has a key msgpack-python cannot read back (a list or a map)")
        out[key] = from_json(v, depth + 1)
    return out


def _float(inner: Any, depth: int) -> float:
    if inner not in _FLOATS:
        raise JsonValueError(f"$float is {inner!r}, not one of {sorted(_FLOATS)}")
    return _FLOATS[inner]


def _packed(tag: str) -> Callable[[Any, int], msgpack.ExtType]:
    code = _PACKED_CODE[tag]

    def decode(inner: Any, depth: int) -> msgpack.ExtType:
        return msgpack.ExtType(code, pack(from_json(inner, depth + 1)))

    return decode


def _decimal(inner: Any, depth: int) -> msgpack.ExtType:
    if not isinstance(inner, str):
        raise JsonValueError("$decimal is not text")
    return msgpack.ExtType(9, inner.encode("utf-8"))


def _uuid(inner: Any, depth: int) -> msgpack.ExtType:
    try:
        return msgpack.ExtType(10, uuid.UUID(inner).bytes)
    except (TypeError, ValueError, AttributeError):
        raise JsonValueError(f"$uuid {inner!r} is not a UUID") from None


def _any_ext(inner: Any, depth: int) -> msgpack.ExtType:
    if not (isinstance(inner, list) and len(inner) == 2 and type(inner[0]) is int and -128 <= inner[0] <= 127):
        raise JsonValueError("$ext is not [code, base64]")
    return msgpack.ExtType(inner[0], _unb64(inner[1]))


_TAGS: dict[str, Callable[[Any, int], Any]] = {
    "$bytes": lambda inner, depth: _unb64(inner),
    "$float": _float,
    "$map": _map,
    "$decimal": _decimal,
    "$uuid": _uuid,
    "$ext": _any_ext,
    **{tag: _packed(tag) for tag in _PACKED_CODE},
}
