"""Redis instructions per page of a ``bench sites`` crawl, counted, not timed.

On a shared machine a few percent of Redis CPU is below the noise of any timed run. This
counts instead: it records everything Redis runs while one worker of KIND (``streams-sched``
or ``streams-sched@REV``) crawls N one-page sites to the end (``MONITOR``, from before the
push), then replays the commands, in order, on one connection, into a redis-server (with
RedisBloom, as ``bench sites``) run under ``valgrind --tool=callgrind
--toggle-collect=call``: the instructions Redis executes inside its ``call()``, command and
script execution only (not the event loop, whose work follows wall time). The crawl's
instructions are the replay to the end less the replay up to the crawl's start; divided by
N, the instructions per page. ``--per-script`` dumps the counters before every EVALSHA
(``--dump-before=evalShaCommand``) and gives each script's instructions per page.
``--variant PREFIX=FILE`` replays with the script whose SHA1 starts with PREFIX replaced by
FILE (the same KEYS and ARGV), which measures a Lua change without a new capture.

    python bench/lua_ir.py capture streams-sched@f4b560e 5000 /tmp/old.mon
    python bench/lua_ir.py count /tmp/old.mon --pages 5000 [--per-script]

Needs valgrind; a replay of 5,000 pages takes about a minute.
"""

from __future__ import annotations

import argparse
import collections
import glob
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK_START, MARK_END = b"CRAWL-START", b"CRAWL-END"
_SKIP = {b"monitor", b"info", b"config", b"client", b"hello", b"ping", b"subscribe", b"psubscribe", b"echo",
         b"select", b"publish", b"quit"}
_ESC = {b'"': b'"', b"\\": b"\\", b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}
_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.S)
_LINE = re.compile(rb"\+[\d.]+ \[\d+ ([^\]]+)\] (.*)", re.S)


def capture(kind: str, n: int, out: Path) -> None:
    """MONITOR a push of ``n`` one-page sites and one worker's whole crawl of them."""
    sys.path.insert(0, str(ROOT))
    import redis

    from bench import sites
    from streams_sched.testing import RedisServer

    args = sites.parse_args(["--sites", str(n), "--window-s", "600", "--kinds", kind, "--no-two-workers",
                             "--no-reference"])
    tmp = Path(tempfile.mkdtemp())
    urls, nothing = tmp / "urls.txt", tmp / "none.txt"
    urls.write_text("".join(f"{sites.site_url(i)}\n" for i in range(n)))
    nothing.write_text("")
    with RedisServer(bloom=True) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=None)
        mon = socket.create_connection(("127.0.0.1", server.port))
        mon.sendall(b"MONITOR\r\n")
        done = threading.Event()

        def record() -> None:
            mon.settimeout(0.5)
            with open(out, "wb") as f:
                while True:
                    try:
                        data = mon.recv(1 << 20)
                    except TimeoutError:
                        if done.is_set():
                            return
                        continue
                    if not data:
                        return
                    f.write(data)

        t = threading.Thread(target=record, daemon=True)
        t.start()
        sites.push_streams(kind, client, server.url, "sites", urls, nothing, n)
        client.echo(MARK_START)
        r = sites.crawl_window(kind, 1, n, server.url, client, "sites", args)
        client.echo(MARK_END)
        time.sleep(1)
        done.set()
        t.join(5)
    print(f"{kind}: {r['pages']:,} pages crawled; capture in {out}")


def _unescape(s: bytes) -> bytes:
    def one(m: re.Match[bytes]) -> bytes:
        g = m.group(1)
        return bytes([int(g[1:], 16)]) if g[:1] == b"x" and len(g) == 3 else _ESC.get(g, g)
    return _ESCAPE.sub(one, s)


def commands(path: Path, upto: bytes) -> Iterator[list[bytes]]:
    """The clients' commands of a capture (not those scripts call), up to the marker ``upto``."""
    for line in path.read_bytes().split(b"\r\n"):
        m = _LINE.match(line) if line.startswith(b"+") else None
        if not m or m.group(1) == b"lua":
            continue
        args = [_unescape(t) for t in _TOKEN.findall(m.group(2))]
        if not args:
            continue
        if args[0].lower() == b"echo" and args[1:2] == [upto]:
            return
        if args[0].lower() not in _SKIP:
            yield args


def _rewrite(args: list[bytes], variants: dict[str, bytes], shas: dict[bytes, bytes]) -> list[bytes]:
    c = args[0].lower()
    if c == b"script" and args[1].lower() == b"load":
        sha = hashlib.sha1(args[2]).hexdigest()
        for prefix, body in variants.items():
            if sha.startswith(prefix):
                shas[sha.encode()] = hashlib.sha1(body).hexdigest().encode()
                return [args[0], args[1], body]
    if c in (b"evalsha", b"evalsha_ro") and args[1] in shas:
        return [args[0], shas[args[1]], *args[2:]]
    if c == b"script" and args[1].lower() == b"exists":
        return [*args[:2], *(shas.get(a, a) for a in args[2:])]
    return args


def replay(path: Path, port: int, upto: bytes, variants: dict[str, bytes]) -> int:
    sock = socket.create_connection(("127.0.0.1", port))
    f = sock.makefile("rb")

    def read() -> None:
        line = f.readline()
        if line[:1] == b"$" and int(line[1:]) >= 0:
            f.read(int(line[1:]) + 2)
        elif line[:1] == b"*":
            for _ in range(max(int(line[1:]), 0)):
                read()

    shas: dict[bytes, bytes] = {}
    n = 0
    for args in commands(path, upto):
        args = _rewrite(args, variants, shas)
        sock.sendall(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        read()
        n += 1
    sock.close()
    return n


def run(path: Path, upto: bytes, variants: dict[str, bytes], per_script: bool) -> tuple[int, Path]:
    """Replay under callgrind; the total instructions inside call(), and the output directory."""
    from streams_sched.testing import find_redisbloom, free_port

    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="lua-ir-"))
    cmd = ["valgrind", "--tool=callgrind", "--toggle-collect=call", f"--callgrind-out-file={work}/cg.out"]
    if per_script:
        cmd.append("--dump-before=evalShaCommand")
    cmd += ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(work)]
    module = find_redisbloom()
    if module:
        cmd += ["--loadmodule", module]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("redis-server under valgrind did not start within 60 s") from None
            time.sleep(0.2)
    replay(path, port, upto, variants)
    subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
    proc.wait()
    total = 0
    for out in glob.glob(f"{work}/cg.out*"):
        for line in open(out):
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
                break
    return total, work


def per_script(path: Path, work: Path, pages: int) -> dict[str, tuple[int, float]]:
    """Each script's calls in the crawl and its instructions per page (a dump before each
    EVALSHA holds the one before it and the commands that followed it)."""
    seq: list[tuple[str, bool]] = []
    crawl = False
    for line in path.read_bytes().split(b"\r\n"):
        if b'"' + MARK_START + b'"' in line:
            crawl = True
        m = re.match(rb'\+[\d.]+ \[\d+ ([^\]]+)\] "(?i:evalsha)" "([0-9a-f]{8})', line)
        if m and m.group(1) != b"lua":
            seq.append((m.group(2).decode(), crawl))
    dumps = {}
    for out in glob.glob(f"{work}/cg.out*"):
        suffix = out.rsplit(".", 1)[-1]
        for line in open(out):
            if line.startswith(("summary:", "totals:")):
                dumps[int(suffix) if suffix.isdigit() else 1 << 60] = int(line.split()[1])
                break
    order = sorted(dumps)
    acc: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for i, (sha, in_crawl) in enumerate(seq):
        if in_crawl and i + 1 < len(order):
            acc[sha][0] += 1
            acc[sha][1] += dumps[order[i + 1]]
    return {sha: (calls, ir / pages) for sha, (calls, ir) in acc.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/lua_ir.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("capture", help="MONITOR a push and one worker's crawl of N one-page sites")
    c.add_argument("kind")
    c.add_argument("sites", type=int)
    c.add_argument("out", type=Path)
    r = sub.add_parser("count", help="the crawl's Redis instructions per page, from a capture")
    r.add_argument("capture", type=Path)
    r.add_argument("--pages", type=int, required=True, help="pages the captured crawl fetched")
    r.add_argument("--variant", action="append", default=[], metavar="PREFIX=FILE")
    r.add_argument("--per-script", action="store_true")
    args = p.parse_args(argv)
    if args.what == "capture":
        capture(args.kind, args.sites, args.out)
        return 0
    variants = {}
    for v in args.variant:
        prefix, file = v.split("=", 1)
        variants[prefix] = Path(file).read_bytes()
    push, _ = run(args.capture, MARK_START, variants, False)
    total, work = run(args.capture, MARK_END, variants, args.per_script)
    print(f"push {push:,} Ir; push and crawl {total:,} Ir; crawl {(total - push) / args.pages:,.0f} Ir/page")
    if args.per_script:
        for sha, (calls, ir) in sorted(per_script(args.capture, work, args.pages).items(), key=lambda kv: -kv[1][1]):
            print(f"  script {sha}: {calls} calls in the crawl, {ir:,.0f} Ir/page")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
