"""Plain-text output of the command line: aligned tables, ages, durations, rates (pure)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Column", "format_age", "format_duration", "format_rate", "format_until", "render_table", "used_columns"]

#: (row field, column title, how to print the field)
Column = tuple[str, str, Callable[[Any], str]]


def format_age(ms: int) -> str:
    """``12.3s``, ``4.5m`` or ``1.2h``; ``-`` for a negative age (none)."""
    if ms < 0:
        return "-"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def format_duration(s: float) -> str:
    """``42s``, ``3m07s`` or ``2h05m``."""
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def format_rate(v: float) -> str:
    """Requests per second: ``0``, ``12.5/s`` or ``340/s``."""
    if v <= 0:
        return "0"
    return f"{v:.1f}/s" if v < 100 else f"{v:.0f}/s"


def format_until(ms: int) -> str:
    """A UTC time of day to a tenth of a second (``14:03:27.4Z``); empty for none."""
    if ms <= 0:
        return ""
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000 // 100}Z"


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """Rows as an aligned table with a header: the first column left-aligned, the others right."""
    header = [title for _, title, _ in columns]
    body = [[fmt(row[key]) for key, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    for r in body:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(lines)


#: what an unused field holds: no count, no age (-1), no time, no flag
_EMPTY = (0, -1, "", None, False)


def used_columns(
    rows: Sequence[dict[str, Any]], columns: Sequence[Column], always: Sequence[str],
) -> tuple[list[Column], list[Column]]:
    """(the columns to print, the ones left out): a column not in ``always`` is left out
    when every row holds nothing in it (0, -1 for an age, an empty string, False), so a
    crawl that tracks no page or renders nothing is not shown a dozen columns of zeros."""
    shown: list[Column] = []
    hidden: list[Column] = []
    for column in columns:
        key = column[0]
        if key in always or any(row[key] not in _EMPTY for row in rows):
            shown.append(column)
        else:
            hidden.append(column)
    return shown, hidden
