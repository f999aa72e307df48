"""``streams-sched dump``, ``load`` and ``move``: a crawl to a JSON Lines file and back, into
any Redis, or from its Redis straight into another while it runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from itertools import chain
from typing import Any

import click
import redis

from streams_sched.cli.options import (
    CliError,
    allow_eviction_option,
    connect,
    connect_for_writes,
    known_crawl,
    load_fingerprinter,
    shared_options,
)
from streams_sched.connect.clients import is_cluster_client, redact
from streams_sched.errors import BadInput, DumpBusy, JournalLost
from streams_sched.exit_codes import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_UNREACHABLE
from streams_sched.frontier.bloom import crawl_bloom, server_has_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import DEFAULT_SHARDS, MAX_SHARDS, validate_site_name
from streams_sched.transfer.inputs import (
    BadLine,
    decode_line,
    file_id,
    numbered_lines,
    open_input,
    open_output,
    position,
)
from streams_sched.transfer.progress import Progress
from streams_sched.transfer.records import BadRecord, Header, parse_record

__all__ = ["dump", "load", "move"]

#: bad lines a load prints; the rest are counted
SHOWN_BAD_LINES = 20


def _server(client: Any) -> str:
    """"redis 7.0.15" / "valkey 9.1.0" (and "cluster" for a cluster), for the header."""
    try:
        cluster = is_cluster_client(client)
        info = client.get_default_node().redis_connection.info("server") if cluster else client.info("server")
        name = "valkey" if info.get("valkey_version") or info.get("server_name") == "valkey" else "redis"
        version = info.get("valkey_version") or info.get("redis_version", "?")
        return f"{name} {version}" + (" cluster" if cluster else "")
    except Exception:  # noqa: BLE001 - a label only
        return ""


@click.command()
@shared_options
@click.option("--output", "-o", default=None, metavar="FILE", help="Write to FILE (gzip when it ends in .gz; default: standard output).")
@click.option("--site", "sites", multiple=True, help="Only this site (repeat for more).")
@click.option("--seen", is_flag=True, help="Also the seen filters, so that dedupe survives a load into a new crawl.")
@click.option("--budget", default=1000, show_default=True, type=click.IntRange(min=10),
              help="Entries one read call takes at most: a longer site is read a chunk at a time.")
def dump(redis_url: str, crawl: str, output: str | None, sites: tuple[str, ...], seen: bool, budget: int) -> None:
    """Write the crawl as JSON Lines: a header, each site's policy, every request (queued,
    leased, delayed, tracked, dead) with all of it, and what workers add while it runs.

    Each site is read at one moment; a request leased then is written as queued, and is
    crawled again after a load."""
    for s in sites:
        try:
            validate_site_name(s)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--site") from None
    client = connect(redis_url)
    known_crawl(client, crawl, redis_url)
    frontier = Frontier(client, crawl, crawl_bloom(client, crawl))
    frontier.use_crawl_defaults(frontier.crawl_meta())
    frontier.load_scripts()
    import streams_sched
    from streams_sched.transfer.dump import Dumper

    bar = Progress()
    try:
        with open_output(output) as out:
            write = out.write
            dumper = Dumper(
                frontier, lambda line: write(line + "\n"), sites=sites or None, seen=seen, budget=budget,
                source=redact(redis_url), server=_server(client), version=streams_sched.__version__,
                progress=lambda done, total, n: bar.update(done, total, n, "requests"),
            )
            summary = dumper.run()
    except (DumpBusy, JournalLost) as exc:
        raise CliError(str(exc)) from None
    finally:
        bar.close()
    states = summary.states
    where = output if output not in (None, "-") else "standard output"
    click.echo(
        f"dumped {summary.requests} request(s) of {summary.sites} site(s) of crawl {crawl} to {where}"
        f" in {summary.seconds:.1f}s ({summary.requests / max(summary.seconds, 1e-6):,.0f}/s): queued"
        f" {states.get('queued', 0)} ({summary.leased} of them leased at the dump: they are crawled again after a"
        f" load), delayed {states.get('delayed', 0)}, tracked {states.get('tracked', 0)}, dead {states.get('dead', 0)};"
        f" {summary.journal} added while it ran", err=True,
    )


def _header(first: tuple[int, bytes] | None, path: str) -> Header | None:
    """The file's header from its first line, None for url-frontier's own lines; BadInput for
    a file that is neither (another format, not JSON Lines, empty)."""
    if first is None:
        raise BadInput(0, f"{path} is empty")
    number, raw = first
    try:
        obj = decode_line(number, raw)
    except BadLine as bad:
        raise BadInput(number, bad.reason + ": this is no dump (no streams-sched header, no url-frontier line)") from None
    try:
        record = parse_record(obj)
    except BadRecord as exc:
        raise BadInput(number, str(exc)) from None
    return record if isinstance(record, Header) else None


@click.command()
@shared_options
@click.argument("file", metavar="FILE")
@click.option("--no-seen", "no_seen", is_flag=True, help="Leave the dump's seen filters out (dedupe then knows the loaded requests only).")
@click.option("--from-crawl", default=None, help="Load only this crawl's lines of a file that holds several (url-frontier's DumpURLs).")
@click.option("--fingerprinter", default=None, metavar="IMPORT.PATH",
              help="The project's REQUEST_FINGERPRINTER_CLASS, if it changes Scrapy's (built as push builds it).")
@click.option("--shards", default=DEFAULT_SHARDS, show_default=True, type=click.IntRange(1, MAX_SHARDS),
              help="Shards of the crawl if the load creates it (STREAMS_SHARDS); a crawl keeps its own.")
@allow_eviction_option
def load(redis_url: str, crawl: str, file: str, no_seen: bool, from_crawl: str | None, fingerprinter: str | None,
         shards: int, allow_eviction: bool) -> None:
    """Load a dump (or url-frontier's own JSON Lines dump) into a crawl, through the one enqueue
    path: the crawl's site policies and dedupe apply, due times count from the load, dead
    letters stay dead letters, policies are restored. Each line is taken once: loading a
    file again, or again after a load that was killed, adds only what is not in yet.

    Exit 5 when lines could not be loaded (each is named with the reason) or the file is cut short."""
    fingerprint = load_fingerprinter(fingerprinter) if fingerprinter else None
    with ExitStack() as stack:
        try:
            stream = stack.enter_context(open_input(file))
            lines = numbered_lines(stream)
            first = next(lines, None)
            header = _header(first, file)
            fid = header.dump_id if header is not None else file_id(file)
        except BadInput as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        assert first is not None
        summary, cut, take_seen, shown = _load(redis_url, crawl, file, stream, chain([first], lines), header, fid,
                                               fingerprint, no_seen, from_crawl, shards, allow_eviction)
    if len(shown) > SHOWN_BAD_LINES:
        click.echo(f"error: ... and {len(shown) - SHOWN_BAD_LINES} more bad line(s)", err=True)
    s = summary
    click.echo(
        f"loaded {s.lines} line(s) of {file} into crawl {crawl} in {s.seconds:.1f}s"
        f" ({s.lines / max(s.seconds, 1e-6):,.0f} lines/s): {s.added} request(s) added, {s.duplicates} duplicate(s),"
        f" {s.over_cap} over a page cap, {s.dead} dead letter(s), {s.done} URL(s) done (seen only),"
        f" {s.policies} site policies, {s.sites_restored} site(s)' counters"
        + (" and seen filters" if take_seen else "") + f"; {s.taken_before} line(s) an earlier load took"
        + (f"; {s.other_crawls} line(s) of other crawls left out" if s.other_crawls else "")
        + (f"; {s.bad} bad line(s)" if s.bad else ""), err=True,
    )
    if cut is not None:
        click.echo(f"error: {cut}; load the whole file again: what is in now is not loaded twice", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if header is not None and s.end is None:
        click.echo(f"error: line {s.lines + 1}: the file ends before the dump's last line (streams_sched_end): it was"
                   " cut short; what came before is loaded; load the whole file again: what is in now is not loaded"
                   " twice", err=True)
        sys.exit(EXIT_BAD_INPUT)
    if s.bad:
        sys.exit(EXIT_BAD_INPUT)


def _load(redis_url: str, crawl: str, file: str, stream: Any, lines: Iterator[tuple[int, bytes]],
          header: Header | None, fid: str, fingerprint: Any, no_seen: bool, from_crawl: str | None, shards: int,
          allow_eviction: bool) -> tuple[Any, BadInput | None, bool, list[str]]:
    """The load itself, on the file's lines from the first: (summary, where the file was cut
    short or None, whether the seen filters went in, the bad lines' numbers)."""
    from streams_sched.transfer.load import Loader, SeenConflict, prepare_crawl

    client = connect_for_writes(redis_url, allow_eviction)
    frontier = Frontier(client, crawl)
    try:
        take_seen = prepare_crawl(frontier, header, seen=not no_seen, has_bloom=server_has_bloom(client), shards=shards,
                                  file_name=os.path.basename(file), file_id=fid)
    except SeenConflict as exc:
        raise CliError(str(exc)) from None
    frontier = Frontier(client, crawl, crawl_bloom(client, crawl))
    frontier.use_crawl_defaults(frontier.crawl_meta())
    frontier.load_scripts()
    shown: list[str] = []

    def report(bad: BadLine) -> None:
        if len(shown) < SHOWN_BAD_LINES:
            click.echo(f"error: {bad}", err=True)
        shown.append(str(bad.line))

    size = os.path.getsize(file) if file != "-" and os.path.exists(file) else 0
    bar = Progress()
    cut: BadInput | None = None
    loader = Loader(frontier, file_id=fid, header=header, fingerprinter=fingerprint, seen=take_seen,
                    from_crawl=from_crawl, report=report,
                    progress=lambda s: bar.update(position(stream), size or None, s.lines, "lines"))
    try:
        summary = loader.run(lines)
    except BadInput as exc:
        cut, summary = exc, loader.summary
    finally:
        bar.close()
    return summary, cut, take_seen, shown


@click.command()
@shared_options
@click.option("--to", "to_url", required=True, metavar="URL",
              help="Redis to move the crawl to (as REDIS_URL: ?cluster=1 for a cluster, redis+sentinel://, rediss://).")
@click.option("--lease-seconds", type=click.FloatRange(min=0), default=None,
              help="Longest wait for the requests in flight (default: the lease time the crawl's workers advertise).")
@click.option("--budget", default=1000, show_default=True, type=click.IntRange(min=10),
              help="Entries one read call takes at most: a longer site is read a chunk at a time.")
@allow_eviction_option
def move(redis_url: str, crawl: str, to_url: str, lease_seconds: float | None, budget: int, allow_eviction: bool) -> None:
    """Move a running crawl to another Redis (a bigger server, a cluster): stop leasing, wait
    for the requests in flight (at most one lease time), copy everything (requests, policies,
    counters, tracked pages, dead letters, seen filters) streamed, and leave a mark in this
    Redis. Workers, producers and daemons that meet it stop with exit code 6 and one line
    naming the new place: start them again with that REDIS_URL.

    A move that fails (or Ctrl-C) lets the crawl go on here as it was."""
    import streams_sched
    from streams_sched.transfer.move import Mover, MoveRefused, lease_time

    source = connect(redis_url)
    known_crawl(source, crawl, redis_url)
    target = connect_for_writes(to_url, allow_eviction)
    frontier = Frontier(source, crawl, crawl_bloom(source, crawl))
    frontier.use_crawl_defaults(frontier.crawl_meta())
    frontier.load_scripts()
    if lease_seconds is None:
        lease_seconds = lease_time(frontier.nodes())
    to = redact(to_url)
    bar = Progress()
    stage = [""]

    def progress(name: str, done: int, total: int, n: int) -> None:
        if name != stage[0]:
            bar.close()
            stage[0] = name
        bar.update(done, total, n, "sites with leases left" if name == "wait" else "requests")

    mover = Mover(frontier, target, to, lease_s=lease_seconds, has_bloom=server_has_bloom(target), budget=budget,
                  source_label=redact(redis_url), server=_server(source), version=streams_sched.__version__,
                  progress=progress)
    try:
        summary = mover.run()
    except MoveRefused as exc:
        raise CliError(str(exc)) from None
    except BaseException as exc:
        bar.close()
        interrupted = isinstance(exc, KeyboardInterrupt)
        if not isinstance(exc, Exception) and not interrupted:
            raise
        what = "interrupted" if interrupted else f"failed: {' '.join(str(exc).split()) or type(exc).__name__}"
        click.echo(
            f"error: the move of crawl {crawl} to {to} {what}. The crawl goes on in {redact(redis_url)} as it was"
            f" (leasing again, nothing lost). The target may hold part of a copy, halted: purge it there"
            f" (streams-sched purge -c {crawl} --redis-url {to} --yes) before you run the move again.", err=True)
        code = EXIT_INTERRUPTED if interrupted else (
            EXIT_UNREACHABLE if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)) else EXIT_ERROR)
        sys.exit(code)
    finally:
        bar.close()
    d, ld = summary.dump, summary.load
    click.echo(
        f"moved crawl {crawl} from {redact(redis_url)} to {to}: {d.requests} request(s) of {d.sites} site(s) (queued"
        f" {d.states.get('queued', 0)}, delayed {d.states.get('delayed', 0)}, tracked {d.states.get('tracked', 0)},"
        f" dead {d.states.get('dead', 0)}; {d.journal} added while it ran), {ld.policies} site policies,"
        f" {ld.sites_restored} site(s)' counters and seen filters", err=True,
    )
    click.echo(
        f"leasing stopped for {summary.paused_s:.2f}s: {summary.wait_s:.2f}s waiting for the requests in flight"
        f" ({summary.leased_sites_at_pause} site(s) with leases, {summary.leased_sites_after_wait} left after the wait,"
        f" at most {lease_seconds:g}s), {summary.copy_s:.2f}s copying; {d.leased} request(s) still leased were copied"
        f" as queued: they are crawled again there", err=True,
    )
    click.echo(
        f"the crawl's old Redis now says it moved: workers, producers and daemons there stop with exit code 6;"
        f" start them with REDIS_URL={to}", err=True,
    )
