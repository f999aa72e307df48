#!/usr/bin/env bash
# Run the test suite: installs what is missing (see scripts/bootstrap.sh), then
# pytest against throwaway redis-servers (plain and with RedisBloom).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not e2e" -x (the in-process tests;
# the markers are in pyproject.toml and docs/development.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TEST_TOOLS=1 source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest "$@"
