"""Exit codes of ``streams-sched`` and of both daemons, in one place."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_MOVED", "EXIT_OK", "EXIT_TIMEOUT",
           "EXIT_UNREACHABLE", "EXIT_USAGE"]

EXIT_OK = 0
#: a runtime error: unknown crawl or site, Redis refused a command, a bad state
EXIT_ERROR = 1
#: a usage error: bad option or argument (click's own code)
EXIT_USAGE = 2
#: Redis did not answer, or refused the credentials
EXIT_UNREACHABLE = 3
#: ``streams-sched watch --until-drained --timeout`` ran out of time
EXIT_TIMEOUT = 4
#: ``streams-sched load``: the file had lines it could not load (each reported with its
#: number and the reason; the others are loaded), or it was cut short or of another format
EXIT_BAD_INPUT = 5
#: the crawl has moved to another Redis (``streams-sched move``): a worker, a producer
#: (``push``, a Seeder's caller) or a daemon that meets the mark in the old Redis stops with
#: it, after one line naming the new place; start it again with that REDIS_URL
EXIT_MOVED = 6
#: interrupted with Ctrl-C (the shell's 128 + SIGINT)
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success",
    EXIT_ERROR: "runtime error (unknown crawl or site, Redis refused a command, ...)",
    EXIT_USAGE: "usage error (bad option or argument)",
    EXIT_UNREACHABLE: "Redis unreachable or credentials refused",
    EXIT_TIMEOUT: "timed out (watch --until-drained --timeout)",
    EXIT_BAD_INPUT: "bad input (load: lines it could not load, a file cut short or of another format)",
    EXIT_MOVED: "the crawl has moved to another Redis (streams-sched move): start again with the REDIS_URL the line names",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}
