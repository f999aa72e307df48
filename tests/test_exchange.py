"""The reactor thread and the I/O thread share only the Exchange (no Redis)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import streams_sched
from streams_sched.frontier.records import Entry
from streams_sched.worker.exchange import OUTBOX_FLUSH, Exchange

#: what the scheduler may call on the I/O thread itself: start and stop it
IO_LIFECYCLE = {"refresh_policy", "start", "stop_leasing", "begin_close", "finish"}
WORKER = Path(streams_sched.__file__).parent / "worker"


def test_the_scheduler_uses_only_the_io_threads_start_and_stop_methods() -> None:
    """Every attribute the scheduler reads or writes on its I/O thread is a lifecycle method; the rest goes through the Exchange."""
    source = (WORKER / "scheduler.py").read_text()
    used: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Attribute) and owner.attr == "_io":
                used.add(node.attr)
            elif isinstance(owner, ast.Name) and owner.id == "io":
                used.add(node.attr)
    assert used and used <= IO_LIFECYCLE, used - IO_LIFECYCLE


#: names the shared Exchange goes by in the worker's code
EXCHANGE_NAMES = {"x", "exchange", "_x"}
#: what writes a field: assignment, augmented assignment, or a queue's append
WRITES = {"append", "appendleft", "extend", "__setitem__"}


def _writers_in_docstring() -> dict[str, str]:
    """Each field the Exchange's docstring lists, with the writer it names."""
    import streams_sched.worker.exchange as module

    doc = module.__doc__ or ""
    found: dict[str, str] = {}
    for m in re.finditer(r"^- ((?:``\w+``(?:, )?)+) \(writer: ``(\w+)``", doc, re.M):
        for name in re.findall(r"``(\w+)``", m.group(1)):
            found[name] = m.group(2)
    for m in re.finditer(r"^- ``(\w+)``: ", doc, re.M):  # both threads, protocol on the field
        found[m.group(1)] = "(both)"
    return found


def _field_writes() -> dict[str, set[str]]:
    """field -> the classes (or modules) whose code assigns it or appends to it on an Exchange."""
    fields = {f.name for f in dataclasses.fields(Exchange)}
    writes: dict[str, set[str]] = {}
    for path in WORKER.rglob("*.py"):
        if path.name == "exchange.py":
            continue
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)] + [tree]:
            owner = cls.name if isinstance(cls, ast.ClassDef) else path.stem
            body = cls.body if isinstance(cls, ast.ClassDef) else [n for n in tree.body if isinstance(n, ast.FunctionDef)]
            for node in (n for b in body for n in ast.walk(b)):
                target = None
                if isinstance(node, (ast.Assign, ast.AugAssign)):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        if isinstance(t, ast.Attribute):
                            target = t
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
                    target = node.func.value if isinstance(node.func.value, ast.Attribute) else None
                if target is None or target.attr not in fields:
                    continue
                base = target.value
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in EXCHANGE_NAMES:
                    writes.setdefault(target.attr, set()).add(owner)
    return writes


def test_every_exchange_field_has_one_writer_named_in_its_docstring() -> None:
    """The Exchange's docstring names each field's one writer, and no other class of the worker assigns the field."""
    named = _writers_in_docstring()
    fields = {f.name for f in dataclasses.fields(Exchange)}
    assert fields == set(named), f"listed but no field: {set(named) - fields}; fields not listed: {fields - set(named)}"
    io_classes = {
        n.name for path in (WORKER / "io").glob("*.py") for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.ClassDef)
    }
    wrong = {
        field: owners for field, owners in _field_writes().items()
        if named[field] != "(both)" and owners - ({named[field]} if named[field] != "io" else io_classes)
    }
    assert not wrong, f"fields written by others than their named writer: {wrong} (named: { {f: named[f] for f in wrong} })"


def test_the_exchange_has_no_instance_dict() -> None:
    """The shared object is a slots dataclass: a typo'd attribute fails instead of silently becoming a new field."""
    x = Exchange()
    assert dataclasses.is_dataclass(x) and not hasattr(x, "__dict__")


def test_a_full_outbox_kicks_the_io_thread() -> None:
    """Operations queue silently until the outbox holds OUTBOX_FLUSH of them, then the I/O thread is woken."""
    x = Exchange()
    op = Entry(b"\0" * 20, 1, 0, b"p", site="a.test")
    for _ in range(OUTBOX_FLUSH - 1):
        x.put(op)
    assert not x.kicked.is_set() and x.may_be_busy()
    x.put(op)
    assert x.kicked.is_set()


def test_weights_default_to_one_and_never_divide_by_zero() -> None:
    """A site the I/O thread has not seen, or with weight 0, counts as weight 1 for fairness."""
    x = Exchange(weights={"a": 3.0, "b": 0.0})
    assert (x.weight("a"), x.weight("b"), x.weight("c")) == (3.0, 1.0, 1.0)
