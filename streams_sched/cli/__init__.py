"""The ``streams-sched`` command line: seed, inspect, operate and clean up crawls.

Every command takes ``--redis-url`` (env ``REDIS_URL``) and most take
``--crawl`` (env ``STREAMS_PREFIX``). Errors are one line on stderr starting
with ``error:``. Exit codes, for scripts (:mod:`streams_sched.exit_codes`):

    0    success
    1    runtime error: unknown crawl or site, Redis refused a command, ...
    2    usage error: bad option or argument
    3    Redis unreachable (or the credentials were refused)
    4    ``watch --until-drained --timeout``: not drained in time
    5    ``load``: bad input (lines it could not load, a file cut short or of another format)
    6    the crawl has moved to another Redis (``streams-sched move``): start again with its URL
    130  interrupted (Ctrl-C)

Layout: ``options`` (the shared connection options, errors as exit codes),
``formatting`` (tables, ages, rates), ``report`` (the per-site status rows), and one
module per topic of commands, none importing another: ``seed`` (push), ``status``
(status, watch), ``sites`` (site set/show, pause, resume), ``dead_letters`` (dlq), ``revisits``,
``nodes`` (nodes, crawls), ``purge``, ``scrapy_redis`` (migrate-scrapy-redis), ``url``
(url) and ``transfer`` (dump, load, move). Scrapy is imported only by the commands that need
it (push, migrate-scrapy-redis, url, load), when they run.
"""

from __future__ import annotations

import click

from streams_sched.cli import (
    dead_letters,
    nodes,
    purge,
    revisits,
    scrapy_redis,
    seed,
    sites,
    status,
    transfer,
    url,
)

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="streams-sched")
def main() -> None:
    """Seed, inspect and clean up streams-sched crawls."""


for _command in (
    seed.push,
    status.status,
    status.watch,
    purge.purge,
    sites.site,
    sites.pause,
    sites.resume,
    dead_letters.dlq,
    revisits.revisits,
    nodes.nodes,
    nodes.crawls,
    scrapy_redis.migrate_scrapy_redis,
    url.url,
    transfer.dump,
    transfer.load,
    transfer.move,
):
    main.add_command(_command)
