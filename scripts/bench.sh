#!/usr/bin/env bash
# The benchmark suite: every benchmark side by side in one run, with
# ratios (see bench/__main__.py and docs/benchmarks.md). Installs the bench
# extra (scrapy-redis 0.9.1, py-spy, pyinstrument) into .venv if missing.
#   scripts/bench.sh --quick          # tiny sizes, well under a minute
#   scripts/bench.sh                  # the full run (15-30 minutes on 2 cores)
#   scripts/bench.sh --only ab --repeat 5 --profile
#   scripts/bench.sh faults --minutes 30   # the seeded fault campaign (bench/faults.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${EXTRAS:-test,bench}"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$VENV/bin/python" -m bench "$@"
