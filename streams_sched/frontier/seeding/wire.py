"""The Seeder's connections: one per primary, commands written now and replies read later.

A batch's enqueue.lua calls go out packed as Redis protocol (packing.py) on one
connection per primary that takes calls of the run; the next batch is written before
the replies of the previous one are read, so Redis works while the seeder prepares.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from streams_sched.connect.clients import RedisClient

__all__ = ["Link", "Wire", "bulk", "is_moved", "unpack"]


class Link:
    """One connection to one primary: commands are written to it now, replies read later, in order."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn = pool.get_connection()
        self.owed = 0

    def write(self, commands: list[bytes]) -> None:
        """Send commands packed in the Redis protocol, in one write."""
        self.owed += len(commands)
        self.conn.send_packed_command([b"".join(commands)], check_health=False)

    def read(self) -> Any:
        """The next reply; an error reply is returned, not raised."""
        self.owed -= 1
        try:
            return self.conn.read_response()
        except ResponseError as exc:
            return exc

    def close(self) -> None:
        if self.owed:
            # replies nobody will read (an error cut the batch short): the connection
            # cannot be used again
            self.conn.disconnect()
        self.pool.release(self.conn)


class Wire:
    """The links of one seeding run: a connection per primary that takes calls of this run."""

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.links: dict[str, Link] = {}

    def node_of(self, key: str) -> str:
        if isinstance(self.client, RedisCluster):
            return str(self.client.get_node_from_key(key).name)  # type: ignore[no-untyped-call]
        return ""

    def link(self, node: str) -> Link:
        link = self.links.get(node)
        if link is None:
            if isinstance(self.client, RedisCluster):
                target = self.client.get_node(node_name=node)  # type: ignore[no-untyped-call]
                pool = self.client.get_redis_connection(target).connection_pool
            else:
                pool = self.client.connection_pool
            link = self.links[node] = Link(pool)
        return link

    def close(self) -> None:
        links, self.links = self.links, {}
        for link in links.values():
            link.close()


def bulk(value: bytes) -> bytes:
    """One argument of a command in the Redis protocol (a bulk string)."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def unpack(command: bytes) -> list[bytes]:
    """The arguments of a command packed in the Redis protocol."""
    reader = hiredis.Reader()
    reader.feed(command)
    parts: list[bytes] = reader.gets()
    return parts


def is_moved(exc: Any) -> bool:
    """A cluster redirection: the slot moved (resharding, failover) since the client read the map."""
    text = str(exc)
    return isinstance(exc, ResponseError) and (
        text.startswith(("MOVED", "ASK")) or type(exc).__name__ in ("MovedError", "AskError")
    )
