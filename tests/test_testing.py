"""The throwaway redis-servers the tests, the demo and the benchmarks start (streams_sched.testing)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from streams_sched.testing import RedisServer, free_port


def test_free_ports_are_outside_the_outgoing_range_and_never_given_twice() -> None:
    """free_port() gives ports no outgoing connection can take as its local end, each once in a process."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]


@pytest.mark.e2e
def test_a_restart_keeps_its_address_or_says_the_port_is_taken() -> None:
    """A killed server starts again at its port; if another process holds the port it fails saying so, not on a new port."""
    server = RedisServer().start()
    try:
        port = server.port
        server.kill()
        server.start()
        assert server.port == port and server.ping()
        server.kill()
        with socket.create_server(("127.0.0.1", port)):
            with pytest.raises(RuntimeError, match=f"could not start again at port {port}"):
                server.start()
        assert server.port == port
    finally:
        server.cleanup()
