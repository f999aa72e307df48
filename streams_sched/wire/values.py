"""Values in meta, cb_kwargs and cookies: msgpack plus typed extension codes.

Plain data (None, bools, ints, floats, str, bytes, lists, dicts with any
plain keys) is packed natively and never reaches the extension machinery.
Everything else goes through msgpack's ``default`` hook and comes back as one
``ExtType``; each code is decoded by one small function::

    code  type            data
    1     tuple           msgpack array of the items
    2     set             msgpack array
    3     frozenset       msgpack array
    (a bytearray is packed natively, as bin: it travels as bytes, as in version 1)
    5     datetime        [y, mo, d, h, mi, s, us, fold(, tz)]
    6     date            [y, mo, d]
    7     time            [h, mi, s, us, fold(, tz)]
    8     timedelta       [days, seconds, microseconds]
    9     Decimal         its str, utf-8
    10    UUID            16 bytes
    16    class by name   [module, qualname, state]   item classes, STREAMS_META_CLASSES
    17    codec by name   [codec name, data]          registered codecs (meta_codecs.py)

    tz:  [0, offset_us, name or None]   a fixed offset (datetime.timezone; other tzinfos
                                         travel as their offset at that instant)
         [1, key, offset_us]             a zoneinfo.ZoneInfo; rebuilt from the zone file of
                                         the system TZPATH, else (or for a time) the offset

Decoding never imports. A class named in an entry is looked up in
``sys.modules`` only (walking module and class ``__dict__``s, so no module
``__getattr__`` runs), and is accepted only if it is an item class
(``ItemAdapter.is_item_class``, dicts excepted: dicts stay dicts) or listed
in STREAMS_META_CLASSES. Subclasses of plain types that are not registered
(an IntEnum, an OrderedDict, a namedtuple) travel as their base type, as
they did in schema version 1: equal, not of the same type.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import os
import re
import sys
import types
import uuid
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

import msgpack
from itemadapter import ItemAdapter

from streams_sched.errors import EntryError
from streams_sched.wire.meta_codecs import MetaCodec, class_path

__all__ = ["ValueCodec", "Unencodable"]

EXT_TUPLE, EXT_SET, EXT_FROZENSET = 1, 2, 3
EXT_DATETIME, EXT_DATE, EXT_TIME, EXT_TIMEDELTA, EXT_DECIMAL, EXT_UUID = 5, 6, 7, 8, 9, 10
EXT_CLASS, EXT_CODEC = 16, 17

_US = dt.timedelta(microseconds=1)
_MAX_DEPTH = 64


class Unencodable(TypeError):
    """Raised inside packing for a value the codec cannot carry; says how to fix it."""


# -- time zones ------------------------------------------------------------

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


# -- classes ---------------------------------------------------------------

def _is_item_class(cls: type) -> bool:
    return not issubclass(cls, dict) and ItemAdapter.is_item_class(cls)


def find_class(module: str, qualname: str) -> type | None:
    """The class ``module.qualname`` among already imported modules, or None. Never imports."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        if not part.isidentifier():
            return None
        # only module and class dictionaries: no __getattr__ or descriptor of anything runs
        obj = vars(obj).get(part) if isinstance(obj, (types.ModuleType, type)) else None
        if obj is None:
            return None
    return obj if isinstance(obj, type) else None


def _slot_names(cls: type) -> list[str]:
    names = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return names


def _attrs_module() -> Any:
    return sys.modules.get("attr")


def _object_state(obj: Any) -> Any:
    """The state an item or STREAMS_META_CLASSES object travels as."""
    cls = type(obj)
    if dataclasses.is_dataclass(cls):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)}
    attr = _attrs_module()
    if attr is not None and attr.has(cls):
        return {a.name: getattr(obj, a.name) for a in attr.fields(cls)}
    if _is_item_class(cls):
        adapter = ItemAdapter(obj)
        return {k: adapter[k] for k in adapter}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, tuple):
        return list(obj)
    state = dict(getattr(obj, "__dict__", {}))
    for name in _slot_names(cls):
        if hasattr(obj, name):
            state[name] = getattr(obj, name)
    return state


def _build(cls: type, state: Any) -> Any:
    """Rebuild an object from ``_object_state``'s data; raises on data that does not fit."""
    if dataclasses.is_dataclass(cls) or (_attrs_module() is not None and _attrs_module().has(cls)):
        if not isinstance(state, dict):
            raise ValueError("state is not a map")
        if dataclasses.is_dataclass(cls):
            fields = [(f.name, f.name, f.init) for f in dataclasses.fields(cls)]
        else:
            fields = [(a.name, getattr(a, "alias", None) or a.name.lstrip("_"), a.init)
                      for a in _attrs_module().fields(cls)]
        unknown = state.keys() - {name for name, _, _ in fields}
        if unknown:
            raise ValueError(f"unknown fields {sorted(map(str, unknown))}")
        obj = cls(**{arg: state[name] for name, arg, init in fields if init and name in state})
        for name, _, init in fields:
            if not init and name in state:
                object.__setattr__(obj, name, state[name])
        return obj
    if _is_item_class(cls):
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ValueError("state is not a map of field names")
        return cls(**state)
    if issubclass(cls, enum.Enum):
        return cls(state)
    if issubclass(cls, tuple):
        if not isinstance(state, list):
            raise ValueError("state is not an array")
        return cls(*state)
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and k.isidentifier() and not k.startswith("__") for k in state
    ):
        raise ValueError("state is not a map of attribute names")
    obj = cls.__new__(cls)
    for name, value in state.items():
        object.__setattr__(obj, name, value)
    return obj


# -- the codec -------------------------------------------------------------

def _enc_datetime(v: dt.datetime) -> list[Any]:
    out: list[Any] = [v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, v.fold]
    if v.tzinfo is not None:
        out.append(_tz_spec(v.tzinfo, v))
    return out


def _enc_time(v: dt.time) -> list[Any]:
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


def _dec_datetime(data: Any) -> dt.datetime:
    d = _ints(data, 8, "datetime")
    tz = _tz_from(d[8]) if len(d) == 9 else None
    return dt.datetime(d[0], d[1], d[2], d[3], d[4], d[5], d[6], tzinfo=tz, fold=d[7])


def _dec_time(data: Any) -> dt.time:
    d = _ints(data, 5, "time")
    tz = _tz_from(d[5]) if len(d) == 6 else None
    return dt.time(d[0], d[1], d[2], d[3], tzinfo=tz, fold=d[4])


def _dec_date(data: Any) -> dt.date:
    return dt.date(*_ints(data, 3, "date")[:3])


def _dec_timedelta(data: Any) -> dt.timedelta:
    days, seconds, us = _ints(data, 3, "timedelta")[:3]
    return dt.timedelta(days=days, seconds=seconds, microseconds=us)


class ValueCodec:
    """Packs request fields with the extension codes above and unpacks them.

    ``meta_classes``: classes (beyond item classes) that travel by name and state
    (STREAMS_META_CLASSES). ``codecs``: registered codecs by class (meta_codecs.py).
    ``ext_used`` tells after ``pack`` whether any extension code was written.
    """

    def __init__(self, meta_classes: Iterable[type] = (), codecs: Mapping[type, MetaCodec] | None = None) -> None:
        self.meta_classes = frozenset(meta_classes)
        self.codecs: dict[type, MetaCodec] = dict(codecs or {})
        self._codec_by_name = {c.name: c for c in self.codecs.values()}
        self.ext_used = False
        self._depth = 0  # of encoding (the reactor thread)
        self._unpack_depth = 0  # of decoding (the I/O thread)
        self._inner_packers: list[Any] = []
        self._encoders: dict[type, Callable[[Any], Any]] = {
            tuple: lambda v: msgpack.ExtType(EXT_TUPLE, self._pack_inner(list(v))),
            set: lambda v: msgpack.ExtType(EXT_SET, self._pack_inner(list(v))),
            frozenset: lambda v: msgpack.ExtType(EXT_FROZENSET, self._pack_inner(list(v))),
            dt.datetime: lambda v: msgpack.ExtType(EXT_DATETIME, self._pack_inner(_enc_datetime(v))),
            dt.date: lambda v: msgpack.ExtType(EXT_DATE, self._pack_inner([v.year, v.month, v.day])),
            dt.time: lambda v: msgpack.ExtType(EXT_TIME, self._pack_inner(_enc_time(v))),
            dt.timedelta: lambda v: msgpack.ExtType(
                EXT_TIMEDELTA, self._pack_inner([v.days, v.seconds, v.microseconds])
            ),
            Decimal: lambda v: msgpack.ExtType(EXT_DECIMAL, str(v).encode()),
            uuid.UUID: lambda v: msgpack.ExtType(EXT_UUID, v.bytes),
        }
        for cls, codec in self.codecs.items():
            self._encoders[cls] = self._codec_encoder(codec)
        self._decoders: dict[int, Callable[[bytes], Any]] = {
            EXT_TUPLE: lambda b: tuple(self._unpack_list(b)),
            EXT_SET: lambda b: set(self._unpack_list(b)),
            EXT_FROZENSET: lambda b: frozenset(self._unpack_list(b)),
            EXT_DATETIME: lambda b: _dec_datetime(self.unpack(b)),
            EXT_DATE: lambda b: _dec_date(self.unpack(b)),
            EXT_TIME: lambda b: _dec_time(self.unpack(b)),
            EXT_TIMEDELTA: lambda b: _dec_timedelta(self.unpack(b)),
            EXT_DECIMAL: lambda b: Decimal(b.decode()),
            EXT_UUID: lambda b: uuid.UUID(bytes=b),
            EXT_CLASS: self._dec_class,
            EXT_CODEC: self._dec_codec,
        }
        #: unpack without a Python frame of our own (the I/O thread's hot path)
        self.unpackb: Callable[[bytes], Any] = functools.partial(
            msgpack.unpackb, raw=False, strict_map_key=False, ext_hook=self.ext_hook
        )
        self._packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=self._default)
        # the base types a subclass falls back to, in the order they are tried
        self._bases: tuple[tuple[type, Callable[[Any], Any]], ...] = (
            (dt.datetime, self._encoders[dt.datetime]),
            (dt.date, self._encoders[dt.date]),
            (dt.time, self._encoders[dt.time]),
            (dt.timedelta, self._encoders[dt.timedelta]),
            (Decimal, self._encoders[Decimal]),
            (uuid.UUID, self._encoders[uuid.UUID]),
            (int, int),
            (float, float),
            (str, str.__str__),
            (bytes, bytes),
            (dict, dict),
            (list, list),
            (tuple, self._encoders[tuple]),
            (frozenset, self._encoders[frozenset]),
            (set, self._encoders[set]),
        )

    # -- encode -------------------------------------------------------------

    def pack(self, obj: Any) -> bytes:
        """msgpack of ``obj``; ``Unencodable`` (a TypeError) for what cannot travel."""
        data: bytes = self._packer.pack(obj)
        return data

    def _pack_inner(self, obj: Any) -> bytes:
        # Packer.pack is not re-entrant: each nesting depth of extension values has a packer
        # of its own, made once (a new Packer costs ~5 us, its reuse ~0.3 us)
        depth = self._depth
        if depth >= _MAX_DEPTH:
            raise Unencodable(f"values nest deeper than {_MAX_DEPTH} tuples, sets or objects (a cycle?)")
        packers = self._inner_packers
        if depth == len(packers):
            packers.append(msgpack.Packer(use_bin_type=True, strict_types=True, default=self._default))
        self._depth = depth + 1
        try:
            data: bytes = packers[depth].pack(obj)
        finally:
            self._depth = depth
        return data

    def _default(self, obj: Any) -> Any:
        self.ext_used = True
        cls = type(obj)
        encoder = self._encoders.get(cls)
        if encoder is None:
            encoder = self._encoder_for(cls)
            self._encoders[cls] = encoder
        try:
            return encoder(obj)
        except Unencodable:
            raise
        except Exception as exc:  # a project codec or an object's attributes failed
            raise Unencodable(f"{class_path(cls)} cannot be encoded: {type(exc).__name__}: {exc}") from None

    def _codec_encoder(self, codec: MetaCodec) -> Callable[[Any], Any]:
        name = codec.name

        def encode(v: Any) -> msgpack.ExtType:
            return msgpack.ExtType(EXT_CODEC, self._pack_inner([name, codec.encode(v)]))

        return encode

    def _encoder_for(self, cls: type) -> Callable[[Any], Any]:
        if cls in self.meta_classes or _is_item_class(cls):
            module, qualname = cls.__module__, cls.__qualname__
            if find_class(module, qualname) is not cls:
                raise Unencodable(
                    f"class {module}.{qualname} cannot be found by its name (defined inside a"
                    " function?); define it at module level"
                )

            def encode(v: Any) -> msgpack.ExtType:
                return msgpack.ExtType(EXT_CLASS, self._pack_inner([module, qualname, _object_state(v)]))

            return encode
        for base, encoder in self._bases:
            if issubclass(cls, base):
                return encoder
        raise Unencodable(
            f"{class_path(cls)} cannot travel through the shared queue; list it in"
            " STREAMS_META_CLASSES (sent as its attributes) or register a codec for it"
            " (STREAMS_META_CODECS / streams_sched.register_meta_codec)"
        )

    # -- decode -------------------------------------------------------------

    def unpack(self, data: bytes) -> Any:
        """The value of ``data`` inside an extension value; EntryError for bad ones and for
        nesting deeper than the encoder writes."""
        depth = self._unpack_depth
        if depth >= _MAX_DEPTH:
            raise EntryError(f"values nest deeper than {_MAX_DEPTH} tuples, sets or objects")
        self._unpack_depth = depth + 1
        try:
            return self.unpackb(data)
        finally:
            self._unpack_depth = depth

    def _unpack_list(self, data: bytes) -> list[Any]:
        value = self.unpack(data)
        if not isinstance(value, list):
            raise EntryError("a tuple or set is not an array")
        return value

    def ext_hook(self, code: int, data: bytes) -> Any:
        decoder = self._decoders.get(code)
        if decoder is None:
            raise EntryError(f"extension type {code} is unknown")
        try:
            return decoder(data)
        except EntryError:
            raise
        except Exception as exc:
            raise EntryError(f"extension type {code}: {type(exc).__name__}: {exc}") from None

    def _dec_class(self, data: bytes) -> Any:
        value = self.unpack(data)
        if not (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)
                and isinstance(value[1], str)):
            raise EntryError("class value is not [module, qualname, state]")
        module, qualname, state = value
        name = f"{module}.{qualname}"
        cls = find_class(module, qualname)
        if cls is None:
            raise EntryError(f"class {name} is not among the modules this worker imported")
        if cls not in self.meta_classes and not _is_item_class(cls):
            raise EntryError(f"class {name} is neither an item class nor listed in STREAMS_META_CLASSES")
        try:
            return _build(cls, state)
        except Exception as exc:
            raise EntryError(f"class {name} rejects its state: {type(exc).__name__}: {exc}") from None

    def _dec_codec(self, data: bytes) -> Any:
        value = self.unpack(data)
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
            raise EntryError("codec value is not [name, data]")
        codec = self._codec_by_name.get(value[0])
        if codec is None:
            raise EntryError(f"no codec for {value[0]} is registered on this worker (STREAMS_META_CODECS)")
        try:
            return codec.decode(value[1])
        except Exception as exc:
            raise EntryError(f"codec {value[0]} rejects its data: {type(exc).__name__}: {exc}") from None
