"""Test and benchmark tools that do not ship in the wheel: a local Redis Cluster,
a local Redis Sentinel set-up, a TCP proxy that drops replies, and a throwaway TLS
certificate authority.

``LocalCluster`` starts a Redis Cluster of several ``RedisServer`` (masters only).
``LocalSentinel`` starts a master, its replicas and three sentinels, and can
SIGKILL the master, wait for the failover and restart the old master.
``TcpProxy`` sits between clients and a server and can drop the server's
replies for a while (Redis runs the commands; the client never hears back), or
cut a connection right after forwarding a command.
``make_tls_files`` generates a CA and server and client certificates.
(The benchmarks import this module as ``tests.redis_tools``.)
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams_sched.testing import RedisServer, TlsFiles, free_port

__all__ = ["LocalCluster", "LocalSentinel", "TcpProxy", "make_tls_files", "wipe_data"]


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


def wipe_data(node: RedisServer) -> None:
    """Delete a stopped node's data files (the AOF directory and any RDB), keeping the rest of
    its directory (a cluster node's nodes.conf, its log): it starts again with no data."""
    if node.proc is not None and node.proc.poll() is None:
        raise RuntimeError(f"wipe_data: 127.0.0.1:{node.port} is still running")
    shutil.rmtree(Path(node.dir, "appendonlydir"), ignore_errors=True)
    Path(node.dir, "dump.rdb").unlink(missing_ok=True)


class LocalCluster:
    """A Redis Cluster of ``masters`` redis-servers on free ports, each with ``replicas`` replicas.

    Each node loads the RedisBloom module when ``bloom`` is set. ``url`` has
    ``?cluster=1``, so :func:`streams_sched.connect.clients.connect` builds a
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
        #: each node's cluster bus port (not port + 10000: the ports are free ones)
        self.bus_ports: dict[int, int] = {}
        for _ in range(masters * (1 + replicas)):
            port = free_port()
            self.bus_ports[port] = free_port()
            self.nodes.append(
                RedisServer(
                    bloom=bloom,
                    port=port,
                    appendonly=appendonly,
                    extra_args=[
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", f"nodes-{port}.conf",
                        "--cluster-port", str(self.bus_ports[port]),
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

    def url_naming(self, nodes: list[RedisServer]) -> str:
        """A cluster URL that names every node of ``nodes``, in that order."""
        return "redis://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes) + "/0?cluster=1"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            self._create(timeout)
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

    def _create(self, timeout: float) -> None:
        """What ``redis-cli --cluster create --cluster-replicas R`` does, without its checks a
        second apart (it took 2 to 5 s, this about 2, the wait of a new master before it
        serves): the first nodes are the masters, with the same slot ranges and distinct
        config epochs, and replica ``i`` follows master ``i % masters``."""
        masters = self.nodes[: len(self.nodes) // (1 + self.replicas)]
        per_master = 16384 / len(masters)
        for i, node in enumerate(self.nodes):
            with contextlib.closing(self.client(node)) as client:
                if i < len(masters):
                    client.execute_command("CLUSTER ADDSLOTSRANGE", round(i * per_master), round((i + 1) * per_master) - 1)
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
        with contextlib.closing(self.client(self.nodes[0])) as first:
            for node in self.nodes[1:]:
                first.execute_command("CLUSTER MEET", "127.0.0.1", node.port, self.bus_ports[node.port])
        self._learn_layout()
        deadline = time.monotonic() + timeout
        for i, node in enumerate(self.nodes[len(masters):]):
            master_id = self._ids[masters[i % len(masters)].port]
            with contextlib.closing(self.client(node)) as client:
                while True:  # a replica must have heard of its master through the bus first
                    try:
                        client.execute_command("CLUSTER REPLICATE", master_id)
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.02)

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

    def restart(self, node: RedisServer, *, empty: bool = False) -> None:
        """Start a killed node again at its old address (it rejoins with its nodes.conf).
        ``empty``: its data files go first, so it rejoins with no data, as a node whose disk
        was lost (or that ran without AOF) does, and takes a full sync from its master."""
        if empty:
            wipe_data(node)
        node.start()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()


def _conf_quote(value: str) -> str:
    """``value`` as one argument of a line of a Redis configuration file."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class LocalSentinel:
    """A Redis Sentinel set-up on free ports: a master, ``replicas`` replicas of it and
    ``sentinels`` sentinels that monitor it as ``service`` (quorum ``quorum``), every
    process a ``RedisServer`` with its files in one temporary directory.

    The sentinels call the master down after ``down_after_ms`` without an answer and
    fail over to a replica; a killed node started again with :meth:`restart` comes
    back as a master with no data (nothing is persisted) until the sentinels
    reconfigure it as a replica of the new master, several seconds later.

    ``password`` is the data nodes' ``requirepass`` (the user:password of
    :attr:`url`), ``sentinel_password`` the sentinels' own (``?sentinel_password=``);
    with ``tls`` every process listens with TLS only and replicates over TLS
    (:attr:`url` is then ``rediss+sentinel://`` with ``ssl_ca_certs``).

    Every wait has a deadline and raises ``RuntimeError`` saying what did not happen.
    """

    def __init__(
        self,
        service: str = "mymaster",
        *,
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        sentinel_password: str | None = None,
        tls: TlsFiles | None = None,
        bloom: bool = False,
        appendonly: bool = False,
    ) -> None:
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.dir = tempfile.mkdtemp(prefix="streams-sched-sentinel-")
        tls_args = ["--tls-replication", "yes"] if tls else []
        auth = ["--requirepass", password, "--masterauth", password] if password else []
        #: the data nodes: nodes[0] is the first master, the others start as its replicas
        self.nodes: list[RedisServer] = [
            RedisServer(
                bloom=bloom, tls=tls, dir=self._subdir(f"node{i}"), appendonly=appendonly, extra_args=[*tls_args, *auth]
            )
            for i in range(1 + replicas)
        ]
        self._sentinel_count = sentinels
        #: the sentinels, built by :meth:`start` (their configuration names the master's port)
        self.sentinels: list[RedisServer] = []

    def _subdir(self, name: str) -> str:
        path = Path(self.dir, name)
        path.mkdir()
        return str(path)

    # -- addresses ------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+sentinel://[:password@]127.0.0.1:P1,...,127.0.0.1:Pn/service/0[?...]``
        (the sentinels' ports are known once :meth:`start` has run)."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        query: dict[str, str] = {}
        if self.sentinel_password:
            query["sentinel_password"] = self.sentinel_password
        if self.tls:
            query["ssl_ca_certs"] = self.tls.ca
        return f"{scheme}://{auth}{hosts}/{self.service}/0" + (f"?{urlencode(query)}" if query else "")

    def _client(self, port: int, password: str | None) -> redis.Redis:
        tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": self.tls.ca} if self.tls else {}
        return redis.Redis(
            "127.0.0.1", port, password=password, decode_responses=True,
            socket_timeout=2, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0), **tls,
        )

    def node_client(self, node: RedisServer) -> redis.Redis:
        """A plain client of one data node (not through the sentinels)."""
        return self._client(node.port, self.password)

    def sentinel_client(self, sentinel: RedisServer) -> redis.Redis:
        return self._client(sentinel.port, self.sentinel_password)

    @staticmethod
    def _ask(client: redis.Redis, call: Any) -> Any:
        """``call(client)``, or None if the server does not answer; closes the client."""
        try:
            return call(client)
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return None
        finally:
            client.close()

    def role(self, node: RedisServer) -> str | None:
        """What ``node`` says it is (ROLE): "master", "slave", or None if it does not answer."""
        reply = self._ask(self.node_client(node), lambda c: c.execute_command("ROLE"))
        return str(reply[0]) if reply else None

    def reported_master_ports(self) -> list[int | None]:
        """The master's port as each running sentinel reports it (None: no answer or no master)."""
        out: list[int | None] = []
        for s in self.sentinels:
            if s.proc is None or s.proc.poll() is not None:
                continue  # killed by the test
            reply = self._ask(self.sentinel_client(s), lambda c: c.sentinel_get_master_addr_by_name(self.service))
            out.append(int(reply[1]) if reply else None)
        return out

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers reports it."""
        for port in self.reported_master_ports():
            if port is not None:
                return port
        raise RuntimeError(f"no sentinel reports a master for {self.service!r}")

    def node_on(self, port: int) -> RedisServer:
        (node,) = [n for n in self.nodes if n.port == port]
        return node

    def master(self) -> RedisServer:
        """The data node the sentinels report as the master."""
        return self.node_on(self.master_port())

    def replicas(self) -> list[RedisServer]:
        """The data nodes other than the reported master."""
        port = self.master_port()
        return [n for n in self.nodes if n.port != port]

    # -- life -----------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LocalSentinel:
        """Start the master, its replicas (attached) and the sentinels, and wait until every
        sentinel sees the master, every replica and every other sentinel: only then can
        they agree on a failover."""
        deadline = time.monotonic() + timeout
        try:
            master, *replicas = self.nodes
            master.start()
            for node in replicas:
                node.extra_args += ["--replicaof", "127.0.0.1", str(master.port)]
                node.start()
            self.wait_replicas(len(replicas), timeout=max(1.0, deadline - time.monotonic()))
            for i in range(self._sentinel_count):
                self.sentinels.append(RedisServer(tls=self.tls, dir=self._subdir(f"sentinel{i}"),
                                                  extra_args=["--tls-replication", "yes"] if self.tls else [],
                                                  sentinel=self._sentinel_conf(master.port)))
                self.sentinels[-1].start()
            self._wait(self._sentinels_agree, deadline - time.monotonic(),
                       "every sentinel to see the master, its replicas and the other sentinels")
        except BaseException:
            self.cleanup()
            raise
        return self

    def _sentinel_conf(self, master_port: int) -> list[str]:
        name = self.service
        lines = [
            f"sentinel monitor {name} 127.0.0.1 {master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {name} {_conf_quote(self.password)}")
        if self.sentinel_password:  # the sentinels' own password, which they also use with each other
            secret = _conf_quote(self.sentinel_password)
            lines += [f"requirepass {secret}", f"sentinel sentinel-pass {secret}"]
        return lines

    def _sentinels_agree(self) -> bool:
        for s in self.sentinels:
            state = self._ask(self.sentinel_client(s), lambda c: c.sentinel_master(self.service))
            if not state or state["is_sdown"] or state["num-slaves"] < len(self.nodes) - 1:
                return False
            if state["num-other-sentinels"] < len(self.sentinels) - 1:
                return False
        return True

    def wait_replicas(self, count: int = 1, timeout: float = 30.0) -> None:
        """Until the master (the sentinels' one once they run) has ``count`` replicas online."""
        def attached() -> bool:
            master = self.master() if self.sentinels else self.nodes[0]
            info = self._ask(self.node_client(master), lambda c: c.info("replication"))
            if not info or info.get("role") != "master":
                return False
            online = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit() and v.get("state") == "online"]
            return int(info.get("connected_slaves", 0)) >= count and len(online) >= count

        self._wait(attached, timeout, f"{count} replica(s) online on the master")

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; return its node (for :meth:`restart`)."""
        node = self.master()
        node.kill()
        return node

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until every sentinel reports a master other than ``old_port`` and that master
        says ROLE master; returns its port."""
        def done() -> int | None:
            ports = set(self.reported_master_ports())
            if len(ports) != 1:
                return None
            (port,) = ports
            if port is None or port == old_port:
                return None
            return port if self.role(self.node_on(port)) == "master" else None

        return int(self._wait(done, timeout, f"a failover away from port {old_port}"))

    def wait_role(self, node: RedisServer, role: str, timeout: float = 30.0) -> None:
        """Until ``node`` says ROLE ``role`` ("master" or "slave")."""
        self._wait(lambda: self.role(node) == role, timeout, f"port {node.port} to be a {role}")

    def restart(self, node: RedisServer, timeout: float = 10.0, *, empty: bool = False) -> RedisServer:
        """Start a killed node again on its port. Without appendonly nothing was persisted, so it comes back
        as an empty master; the sentinels make it a replica of the new master later. ``empty``: its
        data files go first, so it comes back empty even with appendonly."""
        if empty:
            wipe_data(node)
        port = node.port
        node.start(timeout)
        if node.port != port:  # another process took the port meanwhile
            node.stop()
            raise RuntimeError(f"port {port} was taken while the node was down; cannot restart it there")
        return node

    @staticmethod
    def _wait(condition: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.05)

    def cleanup(self) -> None:
        for server in [*self.sentinels, *self.nodes]:
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSentinel:
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
    :meth:`cut_after` instead closes the connection right after forwarding the
    bytes with the marker: the command runs, the client sees its connection drop.
    While the server is down, a client's connection is accepted and closed at
    once (a refused connection), and the proxy goes on listening.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.dropping = threading.Event()
        self.dropped_bytes = 0
        self._marker: bytes | None = None
        self._cut_marker: bytes | None = None
        self._cuts_left = 0
        #: connections closed by :meth:`cut_after` so far
        self.cuts = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy").start()

    def drop_after(self, marker: bytes) -> None:
        """Start dropping replies as soon as a client sends ``marker``."""
        self._marker = marker

    def cut_after(self, marker: bytes, times: int = 1) -> None:
        """Close the next ``times`` connections that send ``marker``, each right after
        forwarding those bytes to the server (b"" matches any bytes)."""
        with self._lock:
            self._cut_marker = marker
            self._cuts_left = times

    def url(self, scheme: str = "redis") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the server is down: refuse this client, keep listening
                client.close()
                continue
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
                if not replies and self._cut(data):
                    break
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _cut(self, data: bytes) -> bool:
        """True if this client's connection is to be cut after ``data`` (one of the cuts asked for)."""
        with self._lock:
            if self._cuts_left <= 0 or self._cut_marker is None or self._cut_marker not in data:
                return False
            self._cuts_left -= 1
            self.cuts += 1
            return True

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()
