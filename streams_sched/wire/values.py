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
    5-8   datetime, date, time, timedelta   (:mod:`.times`)
    9     Decimal         its str, utf-8
    10    UUID            16 bytes
    16    class by name   [module, qualname, state]   item classes, STREAMS_META_CLASSES
                                                      (:mod:`.objects`)
    17    codec by name   [codec name, data]          registered codecs (meta_codecs.py)

This module owns the codes and the packers and unpackers that dispatch on them.
Decoding never imports. Subclasses of plain types that are not registered
(an IntEnum, an OrderedDict, a namedtuple) travel as their base type, as
in schema version 1: equal, not of the same type.
"""

from __future__ import annotations

import datetime as dt
import functools
import uuid
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

import msgpack

from streams_sched.errors import EntryError
from streams_sched.wire.meta_codecs import MetaCodec, class_path
from streams_sched.wire.objects import build, find_class, is_item_class, object_state
from streams_sched.wire.times import (
    Unencodable,
    dec_date,
    dec_datetime,
    dec_time,
    dec_timedelta,
    enc_datetime,
    enc_time,
)

__all__ = ["ValueCodec", "Unencodable"]

EXT_TUPLE, EXT_SET, EXT_FROZENSET = 1, 2, 3
EXT_DATETIME, EXT_DATE, EXT_TIME, EXT_TIMEDELTA, EXT_DECIMAL, EXT_UUID = 5, 6, 7, 8, 9, 10
EXT_CLASS, EXT_CODEC = 16, 17

_MAX_DEPTH = 64


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
            dt.datetime: lambda v: msgpack.ExtType(EXT_DATETIME, self._pack_inner(enc_datetime(v))),
            dt.date: lambda v: msgpack.ExtType(EXT_DATE, self._pack_inner([v.year, v.month, v.day])),
            dt.time: lambda v: msgpack.ExtType(EXT_TIME, self._pack_inner(enc_time(v))),
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
            EXT_DATETIME: lambda b: dec_datetime(self.unpack(b)),
            EXT_DATE: lambda b: dec_date(self.unpack(b)),
            EXT_TIME: lambda b: dec_time(self.unpack(b)),
            EXT_TIMEDELTA: lambda b: dec_timedelta(self.unpack(b)),
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
        if cls in self.meta_classes or is_item_class(cls):
            module, qualname = cls.__module__, cls.__qualname__
            if find_class(module, qualname) is not cls:
                raise Unencodable(
                    f"class {module}.{qualname} cannot be found by its name (defined inside a"
                    " function?); define it at module level"
                )

            def encode(v: Any) -> msgpack.ExtType:
                return msgpack.ExtType(EXT_CLASS, self._pack_inner([module, qualname, object_state(v)]))

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
        if cls not in self.meta_classes and not is_item_class(cls):
            raise EntryError(f"class {name} is neither an item class nor listed in STREAMS_META_CLASSES")
        try:
            return build(cls, state)
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
