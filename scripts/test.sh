#!/usr/bin/env bash
# Run the test suite: installs what is missing (see scripts/bootstrap.sh), then
# pytest against throwaway redis-servers (plain and with RedisBloom).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not e2e" -x (the in-process tests;
# the markers are in pyproject.toml and docs/development.md).
#
# The suite runs in STREAMS_TEST_JOBS pytest-xdist processes (default 3, one test file
# each at a time: a file's module fixtures, such as the zoo's crawls, run once): most of an
# end-to-end test's time is waiting on what it proves (a failover, a lease expiring, a
# Retry-After date), so three share two cores well. STREAMS_TEST_JOBS=0, or -n/-p no:xdist
# among the arguments, runs it in this process.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TEST_TOOLS=1 source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
jobs=(-n "${STREAMS_TEST_JOBS:-3}" --dist loadfile)
for arg in "$@"; do
  case "$arg" in
    -n|-n[0-9]*|--numprocesses|--numprocesses=*|no:xdist) jobs=() ;;
  esac
done
[ "${STREAMS_TEST_JOBS:-3}" = 0 ] && jobs=()
exec "$VENV/bin/python" -m pytest "${jobs[@]}" "$@"
