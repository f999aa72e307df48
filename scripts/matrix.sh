#!/usr/bin/env bash
# Run the tests that touch Scrapy's engine (pytest marker `scrapy_matrix`)
# against other Scrapy releases, each in its own virtualenv.
#
#   scripts/matrix.sh                 # the versions in SCRAPY_MATRIX below (run by .ci/run)
#   scripts/matrix.sh 2.20.0          # try a new Scrapy release before declaring it
#   scripts/matrix.sh 2.20.0 -x -k hook   # extra arguments after the versions go to pytest
#
# The virtualenvs are cached in .venv-scrapy-<version> and rebuilt only when
# pyproject.toml changes, so a rerun costs only the tests. The main .venv (and so
# the main suite) keeps the newest Scrapy. A version above the declared range is
# installed over the declared pin (pip prints a conflict warning) and run with
# STREAMS_ALLOW_UNTESTED_SCRAPY=1, so the tests show whether the hooks still hold.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The oldest declared version first (tests/test_scrapy_compat.py checks it is the
# floor in pyproject.toml), then 2.14.2, the first whose engine awaits a coroutine
# slot.close() (2.13 chains a Deferred). The newest is the main .venv's.
SCRAPY_MATRIX="${SCRAPY_MATRIX:-2.13.4 2.14.2}"

versions=()
while [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+(\.[0-9]+)+[a-z0-9]*$ ]]; do
  versions+=("$1")
  shift
done
[ ${#versions[@]} -gt 0 ] || read -r -a versions <<< "$SCRAPY_MATRIX"

log() { printf '[matrix] %s\n' "$*" >&2; }

# shellcheck source=scripts/find_python.sh
source "$ROOT/scripts/find_python.sh"
PYTHON="$(find_python || true)"
[ -n "$PYTHON" ] || { log "no Python >= 3.11 found (run scripts/bootstrap.sh first)"; exit 1; }

failed=()
for version in "${versions[@]}"; do
  venv="$ROOT/.venv-scrapy-$version"
  stamp="$venv/.streams-sched-installed"
  want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)-scrapy-$version"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "building $venv"
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv"
    if [ -x "$ROOT/.venv/bin/python" ]; then
      # Everything but Scrapy (and what its version pins) comes from the main .venv, put
      # after this one's own packages on sys.path: pip then installs only what differs,
      # in seconds, where a whole install of the test dependencies takes half a minute.
      # pip leaves the main .venv's packages alone ("outside environment").
      main_site="$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      own_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      echo "import site; site.addsitedir('$main_site')" > "$own_site/_streams_sched_main_venv.pth"
    else
      "$venv/bin/python" -m pip install -q --upgrade pip >&2
      "$venv/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[test]" >&2
    fi
    # a separate step so that a release outside the declared range can be tried
    "$venv/bin/python" -m pip install -q "scrapy==$version" >&2
    echo "$want" > "$stamp"
  fi
  got="$("$venv/bin/python" -c 'import scrapy; print(scrapy.__version__)')"
  if [ "$got" != "$version" ]; then
    log "$venv has Scrapy $got, not $version"
    failed+=("$version")
    continue
  fi
  log "Scrapy $version: pytest -m scrapy_matrix $*"
  started=$SECONDS
  if STREAMS_ALLOW_UNTESTED_SCRAPY="${STREAMS_ALLOW_UNTESTED_SCRAPY:-1}" STREAMS_TEST_TARGETS="${STREAMS_TEST_TARGETS:-bitmap}" \
      "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m scrapy_matrix "$@"; then
    log "Scrapy $version: passed in $((SECONDS - started))s"
  else
    log "Scrapy $version: FAILED (after $((SECONDS - started))s)"
    failed+=("$version")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  log "failed on Scrapy ${failed[*]}"
  exit 1
fi
log "passed on Scrapy ${versions[*]}"
