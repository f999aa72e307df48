"""A/B the request codec against an earlier revision's, for plain requests (they stay within 10%).

``python -m bench.codec_ab [--rev REV] [--runs 25]`` loads ``streams_sched/wire/codec.py`` as
it was at ``--rev`` (by default the last revision whose codec writes schema version 1
only) beside the current one, times encode and decode of
the codec bench's plain requests (``link``, ``form``) interleaved in one process, and prints
the best of ``--runs`` runs of 3,000 each and the ratio current / earlier. Best-of, because on
a shared machine noise only ever adds time.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streams_sched.demo.spider import SyntheticSpider
from streams_sched.wire.codec import RequestCodec

from .codec_bench import _requests

ROOT = Path(__file__).resolve().parent.parent


def _old_codec_class(rev: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{rev}:streams_sched/wire/codec.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "codec_old.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("streams_sched._codec_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.RequestCodec


def _us(fn: Callable[[], Any], loops: int = 3000) -> float:
    t = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t) / loops * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.codec_ab", description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="e8fee4f", help="the revision to compare with (default: the last one whose codec writes schema version 1 only)")
    p.add_argument("--runs", type=int, default=25)
    args = p.parse_args(argv)
    spider = SyntheticSpider()
    requests = {k: v for k, v in _requests(spider).items() if k in ("link", "form")}
    codecs = {args.rev: _old_codec_class(args.rev)(spider), "current": RequestCodec(spider)}
    best: dict[tuple[str, str, str], float] = {}
    for run in range(args.runs):
        for rname, request in requests.items():
            order = list(codecs.items())
            for cname, codec in order if run % 2 else reversed(order):
                payload = codec.encode(request)
                ops: tuple[tuple[str, Callable[[], Any]], ...] = (
                    ("encode", lambda c=codec, r=request: c.encode(r)),
                    ("decode", lambda c=codec, b=payload: c.decode(b)),
                )
                for op, fn in ops:
                    t = _us(fn)
                    key = (rname, cname, op)
                    best[key] = min(best.get(key, t), t)
    print(f"| request | codec | encode us | decode us | total us | current / {args.rev} |")
    print("|---|---|---|---|---|---|")
    for rname in requests:
        totals = {c: best[(rname, c, "encode")] + best[(rname, c, "decode")] for c in codecs}
        for c in codecs:
            ratio = f"{totals['current'] / totals[args.rev]:.3f}" if c == "current" else ""
            print(f"| {rname} | {c} | {best[(rname, c, 'encode')]:.2f} | {best[(rname, c, 'decode')]:.2f}"
                  f" | {totals[c]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
