"""Test and benchmark tools that do not ship in the wheel: a local Redis Cluster,
a TCP proxy that drops replies, and a throwaway TLS certificate authority.

``LocalCluster`` starts a Redis Cluster of several ``RedisServer`` (masters only).
``TcpProxy`` sits between clients and a server and can drop the server's
replies for a while (Redis runs the commands; the client never hears back).
``make_tls_files`` generates a CA and server and client certificates.
(The benchmarks import this module as ``tests.redis_tools``.)
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from streams_sched.testing import RedisServer, TlsFiles, free_port

__all__ = ["LocalCluster", "TcpProxy", "make_tls_files"]


def make_tls_files(directory: str, days: int = 2, server_names: tuple[str, ...] = ("localhost", "127.0.0.1")) -> TlsFiles:
    """Generate a CA and server and client certificates signed by it into ``directory``;
    the server certificate is for ``server_names`` (host names and IP addresses)."""
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

    def san(name: str) -> Any:
        try:
            return x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            return x509.DNSName(name)

    server_key, server_cert = leaf(server_names[0], ExtendedKeyUsageOID.SERVER_AUTH, [san(n) for n in server_names])
    client_key, client_cert = leaf("streams-sched worker", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return TlsFiles(
        ca=write_cert(ca_cert, "ca.pem"),
        server_cert=write_cert(server_cert, "server.pem"),
        server_key=write_key(server_key, "server.key"),
        client_cert=write_cert(client_cert, "client.pem"),
        client_key=write_key(client_key, "client.key"),
    )


class LocalCluster:
    """A Redis Cluster of ``masters`` redis-servers on free ports, each with ``replicas`` replicas.

    Each node loads the RedisBloom module when ``bloom`` is set. ``url`` has
    ``?cluster=1``, so :func:`streams_sched.connection.connect` builds a
    cluster client from it. With replicas, :meth:`kill`, :meth:`wait_failover`
    and :meth:`restart` stage a failover the way an operator meets one.
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
        bloom: bool = False,
        appendonly: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.nodes: list[RedisServer] = []
        self.replicas = replicas
        for _ in range(masters * (1 + replicas)):
            port = free_port()
            self.nodes.append(
                RedisServer(
                    bloom=bloom,
                    port=port,
                    appendonly=appendonly,
                    extra_args=[
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-port", str(free_port()),
                        "--cluster-node-timeout", str(node_timeout_ms),
                        *(extra_args or []),
                    ],
                )
            )
        self.bloom_module = self.nodes[0].bloom_module
        self._ids: dict[int, str] = {}
        self._master_of: dict[int, str] = {}

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
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout,
            )
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
            deadline = time.monotonic() + timeout
            while not self.healthy():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster did not reach cluster_state:ok within {timeout}s")
                time.sleep(0.05)
            self._learn_layout()
        except BaseException:
            self.cleanup()
            raise
        return self

    def healthy(self) -> bool:
        """Every live node says cluster_state:ok, and every master has its replicas in sync."""
        live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        if not all(self._state_ok(n.port) for n in live):
            return False
        if not self.replicas:
            return True
        for node in self.masters():
            info = self.client(node).info("replication")
            synced = sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online")
            if synced < self.replicas:
                return False
        return True

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

    @staticmethod
    def client(node: RedisServer) -> Any:
        import redis

        return redis.Redis(port=node.port, socket_timeout=2, socket_connect_timeout=1, decode_responses=True)

    def role(self, node: RedisServer) -> str:
        """'master', 'slave', or 'down'."""
        try:
            return str(self.client(node).execute_command("ROLE")[0])
        except Exception:
            return "down"

    def has_replica(self, master: RedisServer) -> bool:
        """True if ``master`` has a replica in sync."""
        info = self.client(master).info("replication")
        return any(k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online" for k, v in info.items())

    def masters(self) -> list[RedisServer]:
        return [n for n in self.nodes if self.role(n) == "master"]

    def busiest_master(self) -> RedisServer:
        """The live master holding the most keys."""
        return max(self.masters(), key=lambda n: int(self.client(n).dbsize()))

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        self._learn_layout()
        return [n for n in self.nodes if self._master_of.get(n.port) == self._ids.get(master.port)]

    def kill(self, node: RedisServer, *, lag_s: float = 0.0) -> None:
        """SIGKILL ``node`` (its data dir and nodes.conf stay, for a restart). With ``lag_s``,
        its replicas are cut off that long first, so the writes of that time never reach
        them: asynchronous replication's window, made wide enough to hit every time.
        (A replica is paused and its link closed by the master; pausing alone is not
        enough, since the kernel would buffer the stream and hand it over after.)"""
        replicas = self.replicas_of(node)
        if lag_s > 0:
            for r in replicas:
                r.pause()
            self.client(node).execute_command("CLIENT", "KILL", "TYPE", "replica")
            time.sleep(lag_s)
        node.kill()
        for r in replicas:
            r.resume()

    def wait_failover(self, killed: RedisServer, timeout: float = 60.0) -> RedisServer:
        """Wait until a former replica of ``killed`` is master and every live node says
        cluster_state:ok; return the promoted node."""
        replicas = [n for n in self.nodes if self._master_of.get(n.port) == self._ids[killed.port]]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            promoted = [n for n in replicas if n.proc is not None and n.proc.poll() is None and self.role(n) == "master"]
            live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
            if promoted and all(self._state_ok(n.port) for n in live):
                self._learn_layout()
                return promoted[0]
            time.sleep(0.05)
        raise RuntimeError(f"no replica of 127.0.0.1:{killed.port} was promoted within {timeout}s")

    def _learn_layout(self) -> None:
        """Note each node's id, and the master each replica follows."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            try:
                table = self.client(node).execute_command("CLUSTER NODES")
            except Exception:
                continue
            for entry in table.values():
                if "myself" in entry["flags"]:
                    self._ids[node.port] = entry["node_id"]
                    if "slave" in entry["flags"]:
                        self._master_of[node.port] = entry["master_id"]
                    else:
                        self._master_of.pop(node.port, None)

    def restart(self, node: RedisServer) -> None:
        """Start a killed node again at its old address (it rejoins with its nodes.conf)."""
        node.start()

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
