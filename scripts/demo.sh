#!/usr/bin/env bash
# A demo crawl end to end: starts its own redis-server unless REDIS_URL is set,
# serves a synthetic web over HTTP on 127.0.0.1-4, runs workers, kills one with
# SIGKILL, and prints a summary. Installs what is missing (scripts/bootstrap.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m streams_sched.demo "$@"
