"""The text of each script as sent to Redis: the helper files it includes, then its body.

A script's header names the helper files of ``lua/lib/`` it uses on one line::

    -- include: codes, time, streams, index

and each helper file names the ones it uses on its ``-- needs:`` line. The text sent
to Redis is the included files in :data:`LIB_ORDER` (each after the ones it needs),
then the script. A script includes only what it uses: Redis runs a script's whole text
at every call, and defining the Bloom filter code (``bloom.lua``) costs an ack or a
lease about as much as one more Redis command. An include line that leaves out a file
an included one needs fails at import, naming the line to fix.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["LIB_ORDER", "includes", "lib_needs", "read_lua", "script_text"]

#: The helper files of ``lua/lib/``, in the order they are joined: each after the ones it needs.
LIB_ORDER: tuple[str, ...] = (
    "codes", "time", "rate", "streams", "delayed", "inbox", "index", "bands", "answers", "bloom", "snapshot", "freshness",
)

_NOTHING = "(nothing)"


def read_lua(name: str) -> str:
    """The text of ``lua/<name>`` as shipped in the package (``lib/<file>.lua`` for a helper file)."""
    return resources.files("streams_sched.frontier").joinpath("lua", *name.split("/")).read_text(encoding="utf-8")


def _header_list(text: str, label: str, where: str) -> tuple[str, ...]:
    """The names on the ``-- <label>:`` line of a Lua file's leading comment block."""
    prefix = f"-- {label}:"
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if line.startswith(prefix):
            value = line[len(prefix) :].strip()
            return () if value == _NOTHING else tuple(name.strip() for name in value.split(","))
    raise ValueError(f"{where} has no '{prefix}' line in its header (write '{prefix} {_NOTHING}' for none)")


def lib_needs(lib: str) -> tuple[str, ...]:
    """The helper files ``lua/lib/<lib>.lua`` needs (its ``-- needs:`` line)."""
    return _header_list(read_lua(f"lib/{lib}.lua"), "needs", f"lua/lib/{lib}.lua")


def includes(script: str) -> tuple[str, ...]:
    """The helper files ``lua/<script>.lua`` includes (its ``-- include:`` line), checked:
    each is a file of :data:`LIB_ORDER`, and every file one of them needs is included too."""
    where = f"lua/{script}.lua"
    named = _header_list(read_lua(f"{script}.lua"), "include", where)
    unknown = [lib for lib in named if lib not in LIB_ORDER]
    if unknown:
        raise ValueError(f"{where} includes {unknown}, which lua/lib/ does not have; its files: {list(LIB_ORDER)}")
    for lib in named:
        missing = [need for need in lib_needs(lib) if need not in named]
        if missing:
            raise ValueError(f"{where} includes {lib}, which needs {missing}: add them to its include line")
    return named


def script_text(script: str) -> str:
    """The full text of ``lua/<script>.lua`` as sent to Redis: its helper files in
    :data:`LIB_ORDER`, then the script."""
    named = includes(script)
    parts = [read_lua(f"lib/{lib}.lua") for lib in LIB_ORDER if lib in named]
    return "\n".join([*parts, read_lua(f"{script}.lua")])
