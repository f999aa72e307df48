"""One script call, built once and then run, queued on a pipeline, or both: :class:`Call`.

A script's module builds its calls (``call(frontier, ...)``) from its KEYS builder and
ARGV builder and binds its reply parser, so a pipelined call reads its reply with the
same parser as a direct one. :class:`Context` is what a module needs of the frontier
to build a call (the :class:`~streams_sched.frontier.client.Frontier` is one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeAlias, TypeVar

from redis.exceptions import NoScriptError
from redis.typing import EncodableT

from streams_sched.connect.clients import Pipeline, RedisClient
from streams_sched.frontier.keys import CrawlKeys, ShardKeys, SiteKeys
from streams_sched.frontier.records import BloomParams

if TYPE_CHECKING:
    from streams_sched.frontier.clock import RedisClock
    from streams_sched.frontier.scripts import Scripts

__all__ = ["Arg", "Call", "Context"]

#: A value of a script's ARGV, as redis-py sends it.
Arg: TypeAlias = EncodableT

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """A script with its KEYS and ARGV, and the parser of its reply.

    ``run()`` calls it now (redis-py reloads a script the server has forgotten);
    ``queue(pipe)`` puts a bare EVALSHA on a pipeline (on NOSCRIPT the caller runs
    :meth:`Scripts.load` and sends the pipeline again), whose reply ``parse`` reads.
    Build one with the ``call`` function of the script's module.
    """

    script: Any  # redis.commands.core.Script, registered on the frontier's client
    keys: list[str]
    args: list[Arg]
    parse: Callable[[Any], R]

    #: a read-only script (status.lua): run with EVALSHA_RO, falling back to EVAL_RO, so a
    #: read-only ACL user, which may not run SCRIPT LOAD, can run it
    read_only: bool = False

    def run(self, client: RedisClient | None = None) -> R:
        """Run the script now (on ``client``, default the one it is registered on)."""
        if not self.read_only:
            return self.parse(self.script(keys=self.keys, args=self.args, client=client))
        target = client if client is not None else self.script.registered_client
        n = len(self.keys)
        try:
            return self.parse(target.evalsha_ro(self.script.sha, n, *self.keys, *self.args))
        except NoScriptError:
            return self.parse(target.eval_ro(self.script.script, n, *self.keys, *self.args))

    def queue(self, pipe: Pipeline) -> None:
        """Queue a bare EVALSHA (EVALSHA_RO) on ``pipe``: redis-py's own script support would
        send SCRIPT EXISTS before every pipeline, doubling round trips. It goes through
        ``execute_command`` because redis-py's cluster pipeline blocks its ``evalsha``
        method, while it routes a raw EVALSHA by its first key."""
        command = "EVALSHA_RO" if self.read_only else "EVALSHA"
        pipe.execute_command(command, self.script.sha, len(self.keys), *self.keys, *self.args)  # type: ignore[no-untyped-call]


class Context(Protocol):
    """What a script's module reads of the frontier to build a call."""

    group: str
    scripts: Scripts
    keys: CrawlKeys
    bloom: BloomParams
    clock: RedisClock
    default_task: str
    default_policy: tuple[str, ...]
    politeness: str
    revisit_budget_share: float
    revisit_rule: str

    def site(self, site: str) -> SiteKeys: ...

    def shard(self, n: int) -> ShardKeys: ...

    def filters(self, site: str, now: float | None = None) -> list[str]: ...

