"""The server-side scripts, read once at import and registered once per client.

Each ``lua/<name>.lua`` file starts with a header naming its KEYS and ARGV.
``lua/_codes.lua`` (the stream codes) and ``lua/_lib.lua`` (helpers shared by
all of them) are prepended to each script, so every call stays one atomic script that touches only its KEYS.
Only the helpers a script uses are prepended (:func:`assemble`): Redis runs a
script's whole text at every call, and defining the Bloom filter code costs an
ack or a lease about as much as one more Redis command.
Scripts are registered with redis-py's ``register_script``. Called on their own
they reload a script the server has forgotten (NOSCRIPT) transparently; queued
in a pipeline they are a bare EVALSHA, and on NOSCRIPT the caller runs
:meth:`Scripts.load` and sends the pipeline again (see :meth:`Scripts.call`).
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["SCRIPT_NAMES", "Scripts", "source"]

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


def read_lua(name: str) -> str:
    """The text of ``lua/<name>`` as shipped in the package."""
    return resources.files("streams_sched.frontier").joinpath("lua", name).read_text(encoding="utf-8")


_DEFINES = re.compile(r"^local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*=)", re.M)
_NAME = re.compile(r"[A-Za-z_]\w*")


def _chunks(lib: str) -> list[tuple[set[str], str]]:
    """Split helper source into its top-level definitions: (names defined, text), in order.

    A chunk starts at a line beginning ``local`` at column 0 (with the comment lines
    just above it) and runs to the next one.
    """
    lines = lib.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("local ")]
    chunks: list[tuple[set[str], str]] = []
    for n, start in enumerate(starts):
        first = start
        while first > 0 and lines[first - 1].startswith("--") and (n == 0 or first - 1 > starts[n - 1]):
            first -= 1
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        while end > start + 1 and lines[end - 1].startswith("--"):
            end -= 1
        m = _DEFINES.match(lines[start])
        assert m, lines[start]
        names = {m.group(1)} if m.group(1) else {x.strip() for x in m.group(2).split(",")}
        chunks.append((names, "".join(lines[first:end])))
    return chunks


def _without_comments(text: str) -> str:
    return re.sub(r"--[^\n]*", "", text)


def assemble(lib: str, body: str) -> str:
    """``body`` after the helper definitions of ``lib`` it uses, directly or through
    other helpers, in their order in ``lib``. Every script runs its whole text at each
    call, helpers included: a script that does no dedupe does not build the Bloom code."""
    chunks = _chunks(lib)
    wanted = set(_NAME.findall(_without_comments(body)))
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, (names, text) in enumerate(chunks):
            if i not in keep and names & wanted:
                keep.add(i)
                wanted |= set(_NAME.findall(_without_comments(text)))
                changed = True
    return "".join(text for i, (_, text) in enumerate(chunks) if i in keep) + "\n" + body


_LIB = read_lua("_codes.lua") + "\n" + read_lua("_lib.lua")
_SOURCES: dict[str, str] = {name: assemble(_LIB, read_lua(f"{name}.lua")) for name in SCRIPT_NAMES}


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
