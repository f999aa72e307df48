"""Turning Redis reply values into Python text: one helper for every module that reads replies."""

from __future__ import annotations

from typing import Any

__all__ = ["text"]


def text(value: Any) -> str:
    """``value`` as ``str``: bytes are decoded as UTF-8 (undecodable bytes replaced), anything else str()'d."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
