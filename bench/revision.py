"""Run the bench's crawls with streams-sched as it was at an earlier git revision.

A kind written ``KIND@REV`` (``streams-sched@HEAD~5``, ``streams-sched/bitmap@v0.3``)
crawls with the settings of KIND, but its workers import the package
``streams_sched`` from revision REV of this repository (taken with ``git archive``
into a temporary directory), while the harness, the worker script and the probe
stay today's. The two versions are then measured side by side in one run, on
the same machine minutes apart: on a shared machine, a ratio within one run is
the figure that means something, where an absolute time does not.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from functools import cache
from pathlib import Path

__all__ = ["checkout", "split_kind"]

ROOT = Path(__file__).resolve().parent.parent


def split_kind(kind: str) -> tuple[str, str | None]:
    """``"streams-sched@abc123"`` -> ``("streams-sched", "abc123")``; no ``@`` -> (kind, None)."""
    base, sep, rev = kind.partition("@")
    if sep and not rev:
        raise ValueError(f"kind {kind!r} names no revision after '@' (e.g. streams-sched@HEAD~3)")
    return base, (rev or None)


@cache
def checkout(rev: str) -> Path:
    """A directory holding ``streams_sched/`` as it was at ``rev`` (made once per run)."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "streams_sched"],
            check=True, capture_output=True,
        ).stdout
    except FileNotFoundError:
        raise RuntimeError("git is not installed: a KIND@REV bench run needs git and a clone") from None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"cannot take streams_sched from revision {rev!r}: {exc.stderr.decode(errors='replace').strip()}"
            " (give a commit, tag or branch of this clone)"
        ) from None
    dest = Path(tempfile.mkdtemp(prefix=f"bench-rev-{rev.replace('/', '-')[:20]}-"))
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(dest, filter="data")
    return dest
