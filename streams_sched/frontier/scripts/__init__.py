"""The server-side scripts: one Lua file and one typed module each, and the table of them.

A script is three things:

- ``lua/<name>.lua``: the script, starting with a header for its KEYS, ARGV and reply
  and a line naming the helper files of ``lua/lib/`` it includes, which go in front of
  it (:mod:`._source`), so every call stays one atomic script that touches only its KEYS;
- ``scripts/<name>.py``: its KEYS builder (``keys``), its ARGV builder (``args``), its
  reply parser (``parse``, to a typed reply) and ``call(frontier, ...)``, which binds
  the three into a :class:`~._call.Call` to run now or queue on a pipeline;
- its line in :data:`TABLE`.

The texts are read once at import and registered once per client (:class:`Scripts`)
with redis-py's ``register_script``. Called on their own they reload a script the
server has forgotten (NOSCRIPT) transparently; queued in a pipeline they are a bare
EVALSHA, and on NOSCRIPT the caller runs :meth:`Scripts.load` and sends the pipeline
again.
"""

from __future__ import annotations

from types import ModuleType

from redis.commands.core import Script

from streams_sched.connect.clients import RedisClient
from streams_sched.frontier.scripts import (
    ack,
    claim,
    dead,
    enqueue,
    fail,
    feedback,
    freeze_site,
    heartbeat,
    lease,
    load_site,
    promote,
    prune,
    read_site,
    reindex,
    release,
    requeue_dead,
    seen,
    status,
)
from streams_sched.frontier.scripts._call import Call
from streams_sched.frontier.scripts._source import read_lua, script_text

__all__ = ["SCRIPT_NAMES", "TABLE", "Call", "Scripts", "read_lua", "source"]

#: Every script: its name (``lua/<name>.lua``) and its module, one line each.
TABLE: dict[str, ModuleType] = {
    "enqueue": enqueue,
    "lease": lease,
    "claim": claim,
    "ack": ack,
    "dead": dead,
    "release": release,
    "fail": fail,
    "promote": promote,
    "status": status,
    "prune": prune,
    "requeue_dead": requeue_dead,
    "feedback": feedback,
    "reindex": reindex,
    "heartbeat": heartbeat,
    "read_site": read_site,
    "freeze_site": freeze_site,
    "load_site": load_site,
    "seen": seen,
}

SCRIPT_NAMES: tuple[str, ...] = tuple(TABLE)

_SOURCES: dict[str, str] = {name: script_text(name) for name in SCRIPT_NAMES}


def source(name: str) -> str:
    """The full text of script ``name`` as sent to Redis (helpers included)."""
    return _SOURCES[name]


class Scripts:
    """The scripts registered on one client, by name (``scripts["ack"]``)."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self._registered: dict[str, Script] = {name: client.register_script(text) for name, text in _SOURCES.items()}

    def __getitem__(self, name: str) -> Script:
        return self._registered[name]

    def all(self) -> list[Script]:
        return list(self._registered.values())

    def load(self, client: RedisClient | None = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        target = client or self.client
        for script in self.all():
            target.script_load(script.script)
