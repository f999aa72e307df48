"""The reactor thread and the I/O thread share only the Exchange (no Redis)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import streams_sched
from streams_sched.frontier.records import Entry
from streams_sched.worker.exchange import OUTBOX_FLUSH, Exchange

#: what the scheduler may call on the pump itself: start and stop it
PUMP_LIFECYCLE = {"refresh_policy", "start", "stop_leasing", "begin_close", "finish"}


def test_the_scheduler_uses_only_the_pumps_start_and_stop_methods() -> None:
    """Every attribute the scheduler reads or writes on its Pump is a lifecycle method; the rest goes through the Exchange."""
    source = Path(streams_sched.__file__).parent.joinpath("worker", "scheduler.py").read_text()
    used: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Attribute) and owner.attr == "_pump":
                used.add(node.attr)
            elif isinstance(owner, ast.Name) and owner.id == "pump":
                used.add(node.attr)
    assert used and used <= PUMP_LIFECYCLE, used - PUMP_LIFECYCLE


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
