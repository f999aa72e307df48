"""The server-side scripts, read once at import and registered once per client.

Each ``lua/<name>.lua`` file starts with a header naming its KEYS and ARGV and the
helper files of ``lua/lib/`` it includes, which go in front of it
(:mod:`._source`), so every call stays one atomic script that touches only its KEYS.
Scripts are registered with redis-py's ``register_script``. Called on their own
they reload a script the server has forgotten (NOSCRIPT) transparently; queued
in a pipeline they are a bare EVALSHA, and on NOSCRIPT the caller runs
:meth:`Scripts.load` and sends the pipeline again (see :meth:`Scripts.call`).
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from streams_sched.frontier.scripts._source import read_lua, script_text

__all__ = ["SCRIPT_NAMES", "Scripts", "read_lua", "source"]

SCRIPT_NAMES: tuple[str, ...] = (
    "enqueue",
    "lease",
    "claim",
    "ack",
    "dead",
    "release",
    "fail",
    "promote",
    "status",
    "prune",
    "requeue_dead",
    "feedback",
    "reindex",
    "heartbeat",
)


_SOURCES: dict[str, str] = {name: script_text(name) for name in SCRIPT_NAMES}


def source(name: str) -> str:
    """The full text of script ``name`` as sent to Redis (helpers included)."""
    return _SOURCES[name]


class Scripts:
    """The scripts registered on one client. Call them with ``client=pipeline`` to batch."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.enqueue: Script = client.register_script(_SOURCES["enqueue"])
        self.lease: Script = client.register_script(_SOURCES["lease"])
        self.claim: Script = client.register_script(_SOURCES["claim"])
        self.ack: Script = client.register_script(_SOURCES["ack"])
        self.dead: Script = client.register_script(_SOURCES["dead"])
        self.release: Script = client.register_script(_SOURCES["release"])
        self.fail: Script = client.register_script(_SOURCES["fail"])
        self.promote: Script = client.register_script(_SOURCES["promote"])
        self._status: Script = client.register_script(_SOURCES["status"])
        self.prune: Script = client.register_script(_SOURCES["prune"])
        self.requeue_dead: Script = client.register_script(_SOURCES["requeue_dead"])
        self.feedback: Script = client.register_script(_SOURCES["feedback"])
        self.reindex: Script = client.register_script(_SOURCES["reindex"])
        self.heartbeat: Script = client.register_script(_SOURCES["heartbeat"])

    def all(self) -> list[Script]:
        return [self.enqueue, self.lease, self.claim, self.ack, self.dead, self.release, self.fail,
                self.promote, self._status, self.prune, self.requeue_dead, self.feedback, self.reindex,
                self.heartbeat]

    def load(self, client: Any = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        target = client or self.client
        for script in self.all():
            target.script_load(script.script)

    def call(self, script: Script, keys: list[str], args: list[Any], pipe: Any = None) -> Any:
        """Run ``script`` now (reloading it on NOSCRIPT), or queue it on ``pipe``.

        In a pipeline this queues a bare EVALSHA: redis-py's own script support
        would send SCRIPT EXISTS before every pipeline, doubling round trips.
        It goes through ``execute_command`` because redis-py's cluster pipeline
        blocks its ``evalsha`` method, while it routes a raw EVALSHA by its
        first key. A NOSCRIPT reply comes back as that command's error; the
        caller calls :meth:`load` and retries.
        """
        if pipe is None:
            return script(keys=keys, args=args, client=self.client)
        return pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def status_ro(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """Run the read-only status script with EVALSHA_RO, falling back to EVAL_RO.

        Works for a read-only ACL user, which may not run SCRIPT LOAD.
        """
        script = self._status
        try:
            return client.evalsha_ro(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval_ro(script.script, len(keys), *keys, *args)
