"""The alert state file (``--state-file``): the monitor's memory across restarts.

Without it a restarted monitor (systemd ``Restart=always``, a deploy, ``--burst``
from cron) sees every condition that still holds as new and alerts again, and
never says "resolved" for one that cleared while it was down. The file holds
the debouncer's active alerts and the dead-letter and eviction baselines as JSON
(a file without the eviction baselines, from an earlier version, loads), written
atomically (temporary file, fsync, rename) whenever they change. The settings
check at start that its directory can be written.

A file that cannot be read back (hand-edited, truncated, another version) is
logged and set aside as ``<file>.bad``: the monitor starts fresh rather than
not at all.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import structlog

from .alerts import AlertRules, Debouncer

__all__ = ["AlertState"]

log = structlog.get_logger("monitor.state")

VERSION = 1


class AlertState:
    """Loads and saves the alert state of one monitor."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._last: str | None = None

    def load(self, rules: AlertRules, debouncer: Debouncer, now_s: float) -> bool:
        """Restore the saved state into ``rules`` and ``debouncer``. False when there was none."""
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return False
        try:
            data = json.loads(raw)
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {VERSION}")
            elapsed_s = max(0.0, time.time() - float(data["saved_at"]))
            fresh_rules, fresh_deb = AlertRules(), Debouncer()
            fresh_rules.restore(data["dead_letters"], now_s, elapsed_s)
            fresh_rules.restore_evictions(data.get("evictions", {}), now_s, elapsed_s)
            fresh_deb.restore(data["active"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            bad = self.path.with_name(self.path.name + ".bad")
            os.replace(self.path, bad)
            log.warning("state_file_unreadable", path=str(self.path), error=str(exc), moved_to=str(bad),
                        hint="starting with no alert state: conditions that hold now alert again")
            return False
        rules._dlq.update(fresh_rules._dlq)
        rules._evicted.update(fresh_rules._evicted)
        debouncer.active.update(fresh_deb.active)
        log.info("state_loaded", path=str(self.path), active_alerts=len(debouncer.active), saved_s_ago=round(elapsed_s, 1))
        return True

    def save(self, rules: AlertRules, debouncer: Debouncer, now_s: float) -> None:
        """Write the state if it changed since the last save (atomic: readers see old or new)."""
        active, dead_letters, evictions = debouncer.snapshot(), rules.snapshot(now_s), rules.snapshot_evictions(now_s)
        key = json.dumps({"active": active, "dl": {c: v["count"] for c, v in dead_letters.items()},
                          "ev": {s: v["count"] for s, v in evictions.items()}}, sort_keys=True)
        if key == self._last:
            return
        body = {"version": VERSION, "saved_at": time.time(), "active": active, "dead_letters": dead_letters,
                "evictions": evictions}
        text = json.dumps(body, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._last = key
