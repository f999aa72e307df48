"""A dump file's lines, numbered, with the reason when one cannot be read (file I/O only).

:func:`numbered_lines` yields ``(number, text)`` for each whole line and raises
:class:`BadInput` (with the number of the line it stopped at) for what ends the file
early: a gzip stream cut short or corrupt, a last line without its newline (a plain file
cut short). A line that is not UTF-8 is one :class:`BadLine` the caller reports and goes
on from. Gzip is told by its first bytes, whatever the file is called; ``-`` is standard
input. :func:`file_id` is what a load without a dump's header (url-frontier's own dump)
records the file under: a hash of its lines.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from streams_sched.errors import BadInput

__all__ = ["BadInput", "BadLine", "decode_line", "file_id", "numbered_lines", "open_input", "open_output", "position"]

GZIP_MAGIC = b"\x1f\x8b"


class BadLine(ValueError):
    """One line that is no line of a dump; the load reports it and goes on."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}")


@contextmanager
def open_input(path: str) -> Iterator[IO[bytes]]:
    """The file's bytes, gunzipped when it starts as gzip does (``-``: standard input)."""
    raw: IO[bytes]
    if path == "-":
        raw = sys.stdin.buffer
        close = False
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise BadInput(0, f"cannot open {path}: {exc.strerror or exc}") from None
        close = True
    try:
        head = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
        if head == GZIP_MAGIC:
            yield gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[misc]
        else:
            if path.endswith(".gz") and head:
                raise BadInput(0, f"{path} is named .gz but is not gzip (it starts with {head!r})")
            yield raw
    finally:
        if close:
            raw.close()


def position(stream: IO[bytes]) -> int:
    """How far into the file (its bytes on disk, compressed or not) ``stream`` has read."""
    raw = getattr(stream, "fileobj", stream)
    try:
        return int(raw.tell())
    except (OSError, ValueError, AttributeError):
        return 0


def numbered_lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line number, line without its newline)``, from 1. Raises BadInput where the file
    ends early (see the module docstring)."""
    n = 0
    try:
        for raw in stream:
            n += 1
            if not raw.endswith(b"\n"):
                raise BadInput(n, "the file ends in the middle of this line: it was cut short (the line is not loaded)")
            yield n, raw[:-1].rstrip(b"\r")
    except EOFError:
        raise BadInput(n + 1, "the gzip stream ends early: the file was cut short (what came before is loaded)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise BadInput(n + 1, f"the gzip data is corrupt ({exc})") from None


def decode_line(number: int, raw: bytes) -> Any:
    """The JSON value of a line; BadLine for text that is not UTF-8 or not JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(number, f"not UTF-8 text (byte {exc.start + 1} is {raw[exc.start:exc.start + 1]!r}):"
                              " binary data, or a file of another kind") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadLine(number, f"not JSON ({exc})") from None


def file_id(path: str) -> str:
    """What a file without a dump's header is recorded under: the SHA-256 of its lines
    (gunzipped), 32 hex digits. Standard input has none (it can be read once)."""
    if path == "-":
        raise BadInput(0, "a file without a streams-sched header (url-frontier's own dump) must be a file, not"
                          " standard input: its contents name it, so that loading it again adds nothing")
    h = hashlib.sha256()
    with open_input(path) as stream:
        try:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
        except EOFError:
            raise BadInput(0, "the gzip stream ends early: the file was cut short") from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise BadInput(0, f"the gzip data is corrupt ({exc})") from None
    return h.hexdigest()[:32]


@contextmanager
def open_output(path: str | None, level: int = 3) -> Iterator[IO[str]]:
    """Where a dump writes: a file (gzip when its name ends in .gz) written under a ``.part``
    name and renamed once whole, or standard output (None or ``-``)."""
    if path is None or path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    final = Path(path)
    part = final.with_name(final.name + ".part")
    binary: IO[bytes] = open(part, "wb")  # noqa: SIM115 - closed below
    ok = False
    try:
        if final.name.endswith(".gz"):
            zipped = gzip.GzipFile(filename=final.name[:-3], fileobj=binary, mode="wb", compresslevel=level, mtime=0)
            text: IO[str] = io.TextIOWrapper(zipped, encoding="utf-8", newline="\n")
        else:
            text = io.TextIOWrapper(binary, encoding="utf-8", newline="\n", write_through=False)
        yield text
        text.flush()
        text.close()
        ok = True
    finally:
        if not binary.closed:
            binary.close()
        if ok:
            part.replace(final)
        else:
            part.unlink(missing_ok=True)
