"""Objects in meta values that travel by class name and state, and how they come back.

It owns extension code 16 of :mod:`.values`: item classes and STREAMS_META_CLASSES
travel as ``[module, qualname, state]``. Decoding never imports: a class named in an
entry is looked up in ``sys.modules`` only (walking module and class ``__dict__``s, so
no module ``__getattr__`` runs); the codec accepts it only if it is an item class
(``ItemAdapter.is_item_class``, dicts excepted: dicts stay dicts) or listed in
STREAMS_META_CLASSES.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from typing import Any

from itemadapter import ItemAdapter

__all__ = ["find_class", "is_item_class", "object_state", "build"]


def is_item_class(cls: type) -> bool:
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


def object_state(obj: Any) -> Any:
    """The state an item or STREAMS_META_CLASSES object travels as."""
    cls = type(obj)
    if dataclasses.is_dataclass(cls):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(cls)}
    attr = _attrs_module()
    if attr is not None and attr.has(cls):
        return {a.name: getattr(obj, a.name) for a in attr.fields(cls)}
    if is_item_class(cls):
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


def build(cls: type, state: Any) -> Any:
    """Rebuild an object from ``object_state``'s data; raises on data that does not fit."""
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
    if is_item_class(cls):
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
