"""The switch interval the scheduler holds while open (streams_sched/gil.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from streams_sched.gil import PYTHON_DEFAULT_S, hold_switch_interval, release_switch_interval


@pytest.fixture(autouse=True)
def python_default() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHON_DEFAULT_S)
    yield
    sys.setswitchinterval(before)


def test_two_schedulers_hold_it_and_the_last_to_close_puts_the_default_back() -> None:
    """Held by two, the interval stays set until both released it, then Python's default is back."""
    assert hold_switch_interval(1.0) and hold_switch_interval(1.0)
    assert sys.getswitchinterval() == pytest.approx(0.001)
    release_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(0.001)
    release_switch_interval()
    assert sys.getswitchinterval() == PYTHON_DEFAULT_S
    release_switch_interval()  # one too many: no effect
    assert sys.getswitchinterval() == PYTHON_DEFAULT_S


def test_an_interval_the_process_chose_is_left_alone() -> None:
    """A process that set its own interval keeps it, through open and close."""
    sys.setswitchinterval(0.02)
    assert not hold_switch_interval(1.0)
    assert sys.getswitchinterval() == pytest.approx(0.02)


def test_zero_leaves_it_alone() -> None:
    """STREAMS_GIL_SWITCH_MS = 0 changes nothing."""
    assert not hold_switch_interval(0)
    assert sys.getswitchinterval() == PYTHON_DEFAULT_S
