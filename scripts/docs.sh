#!/usr/bin/env bash
# Build the docs site into docs/_build/html: bootstrap the checkout (with the docs
# extra: sphinx, myst-parser, furo), then sphinx-build with warnings as errors, as
# tests/test_docs.py does. Extra arguments go to sphinx-build (e.g. -b linkcheck).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export EXTRAS="${EXTRAS:-test,docs}"   # the same extras as scripts/test.sh, so neither reinstalls after the other
# shellcheck source=scripts/bootstrap.sh
source "$ROOT/scripts/bootstrap.sh"
"$ROOT/.venv/bin/python" -m sphinx -W --keep-going -b html "$@" "$ROOT/docs" "$ROOT/docs/_build/html"
echo "[docs] built $ROOT/docs/_build/html/index.html" >&2
