#!/usr/bin/env bash
# The versions of what streams-sched depends on, and the two edges of their ranges.
#
#   scripts/deps.sh lowest     # the declared floors of the six packages below, the rest from
#                              # constraints.txt: must pass (run by .ci/run)
#   scripts/deps.sh newest     # every dependency at its newest release within the declared
#                              # ranges: reported, never decides whether CI passes (run by
#                              # .ci/run; STREAMS_NEWEST_STRICT=1 makes a failure fail)
#   scripts/deps.sh refresh    # rewrite constraints.txt from the newest releases, once they
#                              # pass the same checks (see docs/development.md)
#
# CI and the scripts install from constraints.txt (scripts/bootstrap.sh), so whether a
# change lands depends on its own code, not on what PyPI released that morning. The edges
# are checked with the in-process tests (-m "not e2e") and two short crawls compared with
# Scrapy's own; a failure names the package and the version that makes it fail, found by
# putting each suspect back to its version in constraints.txt and running the failed tests
# again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CONSTRAINTS="$ROOT/constraints.txt"
# The packages whose floors are declared in pyproject.toml and checked here: the ones whose
# APIs the code calls directly (w3lib, Twisted), or whose wire behaviour it relies on.
EDGE_PACKAGES="scrapy twisted w3lib redis hiredis msgpack"
# A short crawl of each kind, compared with Scrapy's in-memory scheduler.
CRAWLS=(
  "tests/test_e2e.py::test_one_worker_crawls_every_page_once_and_closes"
  "tests/test_zoo.py::test_zoo_spider_gives_the_in_memory_items_through_redis"
)
CRAWL_FILTER="bitmap"

log() { printf '[deps] %s\n' "$*" >&2; }

# shellcheck source=scripts/find_python.sh
source "$ROOT/scripts/find_python.sh"
PYTHON="$(find_python || true)"
[ -n "$PYTHON" ] || { log "no Python >= 3.11 found (run scripts/bootstrap.sh first)"; exit 1; }

# pip's own output goes to a log, shown only when pip fails (setuptools prints a long
# warning about editable installs that says nothing about this project).
pip_in() {
  local venv="$1"; shift
  if ! "$venv/bin/python" -m pip "$@" >"$venv/pip.log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$venv/pip.log" >&2 || true
    log "pip $* failed in $venv"
    return 1
  fi
}

# pip_quiet VENV ARGS...: pip, silent whatever happens (a suspect that cannot move alone)
pip_quiet() {
  local venv="$1"; shift
  "$venv/bin/python" -m pip "$@" >/dev/null 2>&1
}

new_venv() {
  local venv="$1"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  pip_in "$venv" install -q --upgrade pip
}

# versions VENV: "name==version" of the edge packages installed in VENV
versions() {
  "$1/bin/python" - "$EDGE_PACKAGES" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1].split():
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(f"{name}==(not installed)")
EOF
}

# floors: "name==floor" for each edge package, from the ">=" of its requirement in
# pyproject.toml (a package without one there is an error: its floor must be declared)
floors() {
  "$PYTHON" - "$ROOT/pyproject.toml" "$EDGE_PACKAGES" <<'EOF'
import re
import sys
import tomllib

deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
for name in sys.argv[2].split():
    for dep in deps:
        m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*([^;]*)", dep)
        if m and m.group(1).lower() == name:
            floor = re.search(r">=\s*([0-9][^,\s]*)", m.group(3))
            if not floor:
                sys.exit(f"pyproject.toml declares no floor (>=) for {name}: {dep!r}")
            print(f"{name}=={floor.group(1)}")
            break
    else:
        sys.exit(f"pyproject.toml does not declare {name}: its floor must be declared to be checked")
EOF
}

# pinned NAME FILE: the version of NAME in a "name==version" file, or nothing
pinned() {
  grep -i "^$1==" "$2" | head -1 | cut -d= -f3
}

# run_tests VENV ARGS...: pytest in VENV as CI runs it, remembering ARGS in
# VENV/failed-args when it fails, for culprit() to run the failed tests again
run_tests() {
  local venv="$1"; shift
  if CI=1 STREAMS_ALLOW_UNTESTED_SCRAPY=0 "$venv/bin/python" -m pytest -q --no-header -p cacheprovider \
      -o cache_dir="$venv/.pytest_cache" -n 2 --dist loadfile "$@"; then
    return 0
  fi
  printf '%s\n' "$@" > "$venv/failed-args"
  return 1
}

# checks VENV TAG: the in-process tests, then the short crawls
checks() {
  local venv="$1" tag="$2"
  rm -rf "$venv/.pytest_cache" "$venv/failed-args"
  log "$tag: pytest -m 'not e2e'"
  run_tests "$venv" -m "not e2e" -x || return 1
  log "$tag: the short crawls (${CRAWLS[*]}, $CRAWL_FILTER)"
  run_tests "$venv" -k "$CRAWL_FILTER" "${CRAWLS[@]}"
}

# culprit VENV REFERENCE-FILE: put each package whose version differs from the reference
# back to the reference's version, one at a time (the edge packages first), and run the
# failed tests again; prints the first whose own version makes them fail
culprit() {
  local venv="$1" reference="$2" name have want
  local suspects=() failed=()
  mapfile -t failed < "$venv/failed-args"
  while read -r name have want; do
    # a package the reference does not pin cannot be put back to its version
    [ "$want" = none ] || suspects+=("$name $have $want")
  done < <(differing "$venv" "$reference")
  local now pins
  now="$(mktemp)"; pins="$(mktemp)"
  "$venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null | grep '==' > "$now"
  for suspect in "${suspects[@]}"; do
    read -r name have want <<< "$suspect"
    [ -n "$name" ] || continue
    # this one package at the reference's version, every other installed one as it is, and
    # what only the reference's version needs (w3lib 2.6 brings a package of its own) at
    # the reference's versions; a suspect that cannot move alone is skipped
    { grep -vi "^$name==" "$now"; echo "$name==$want"
      grep '==' "$reference" | grep -viFf <(sed 's/==.*/==/' "$now"); } > "$pins"
    pip_quiet "$venv" install -q -c "$pins" "$name==$want" || continue
    if CI=1 STREAMS_ALLOW_UNTESTED_SCRAPY=0 "$venv/bin/python" -m pytest -q -p cacheprovider \
        -o cache_dir="$venv/.pytest_cache" --lf --lfnf=none --no-header "${failed[@]}" >/dev/null 2>&1; then
      pip_quiet "$venv" install -q -c "$now" "$name==$have" || true
      rm -f "$now" "$pins"
      echo "$name $have (the failed tests pass with $name $want)"
      return 0
    fi
    pip_quiet "$venv" install -q -c "$now" "$name==$have" || true
  done
  rm -f "$now" "$pins"
  echo "no single package (the versions that differ from $(basename "$reference"): ${suspects[*]:-none})"
}

lowest() {
  local venv="$ROOT/.venv-lowest" pins
  pins="$(mktemp)"
  floors > "$pins"
  # everything else as CI has it; the edge packages at their floors
  grep -viE "^($(echo "$EDGE_PACKAGES" | tr ' ' '|'))==" "$CONSTRAINTS" >> "$pins"
  log "lowest: $(floors | tr '\n' ' ')"
  new_venv "$venv"
  pip_in "$venv" install -q -c "$pins" -e "$ROOT[test,docs]"
  rm -f "$pins"
  log "lowest: installed $(versions "$venv" | tr '\n' ' ')"
  if checks "$venv" lowest; then
    log "lowest: passed"
    return 0
  fi
  log "lowest: FAILED on the declared floors; finding the package ..."
  log "lowest: FAILED with $(culprit "$venv" "$CONSTRAINTS"): raise its floor in pyproject.toml, or make the code work with it"
  return 1
}

# differing VENV REFERENCE: "name have want" for each package installed in VENV at another
# version than the "name==version" file REFERENCE pins ("none": not pinned there), the edge
# packages first
differing() {
  "$1/bin/python" -m pip freeze --exclude-editable 2>/dev/null | "$PYTHON" -c '
import sys
edge = sys.argv[2].split()
ref = {}
for line in open(sys.argv[1]):
    if "==" in line and not line.startswith("#"):
        name, _, version = line.strip().partition("==")
        ref[name.lower()] = version
rows = []
for line in sys.stdin:
    name, sep, have = line.strip().partition("==")
    want = ref.get(name.lower(), "none")
    if sep and want != have:
        rows.append((name.lower() not in edge, name.lower(), f"{name} {have} {want}"))
print("\n".join(row[2] for row in sorted(rows)))
' "$2" "$EDGE_PACKAGES"
}

# newer_than_constraints VENV: "name have (constraints: want)" for each package installed in
# VENV at another version than constraints.txt pins, on one line; nothing when none differs
newer_than_constraints() {
  local name have want out=()
  while read -r name have want; do
    [ -n "$name" ] && out+=("$name $have (constraints: $want)")
  done < <(differing "$1" "$CONSTRAINTS")
  local IFS=,
  echo "${out[*]}" | sed 's/,/, /g'
}

newest() {
  local venv="$ROOT/.venv-newest"
  new_venv "$venv" || return 1
  pip_in "$venv" install -q --upgrade --upgrade-strategy eager -e "$ROOT[test,docs]" || return 1
  log "newest: installed $(versions "$venv" | tr '\n' ' ')"
  local newer
  newer="$(newer_than_constraints "$venv")"
  if [ -z "$newer" ]; then
    # the main suite ran on exactly these versions: running the checks again tells nothing
    log "newest: every newest release is constraints.txt's own version, which the main suite ran on"
    return 0
  fi
  log "newest: newer than constraints.txt: $newer"
  if checks "$venv" newest; then
    log "newest: passed"
    return 0
  fi
  log "newest: FAILED; finding the package ..."
  log "newest: FAILED with $(culprit "$venv" "$CONSTRAINTS"): a release newer than constraints.txt;" \
      "make the code work with it (then scripts/deps.sh refresh), or cap it in pyproject.toml"
  return 1
}

refresh() {
  local venv="$ROOT/.venv-refresh" new
  new_venv "$venv"
  pip_in "$venv" install -q --upgrade --upgrade-strategy eager -e "$ROOT[test,docs,bench]"
  checks "$venv" refresh || { log "refresh: the newest releases fail the checks; constraints.txt unchanged"; return 1; }
  new="$(mktemp)"
  {
    echo "# Known-good versions of every dependency (with the test, docs and bench extras):"
    echo "# scripts/bootstrap.sh installs from it, so CI's result depends on the change alone."
    echo "# Written by 'scripts/deps.sh refresh' on $(date -u +%Y-%m-%d) with Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')."
    "$venv/bin/python" -m pip freeze --exclude-editable 2>/dev/null | grep '==' | LC_ALL=C sort -f
  } > "$new"
  mv "$new" "$CONSTRAINTS"
  rm -rf "$venv"
  log "refresh: constraints.txt rewritten; diff it, run CI=1 ./scripts/test.sh -q with it, and commit it"
}

# sourced (by a test of these functions): define them, run nothing
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case "${1:-}" in
  lowest) lowest ;;
  newest)
    if newest; then
      exit 0
    elif [ "${STREAMS_NEWEST_STRICT:-0}" = 1 ]; then
      exit 1
    else
      log "newest: reported, not failed (a new release must not decide whether a change lands;" \
          "STREAMS_NEWEST_STRICT=1 makes it fail)"
    fi
    ;;
  refresh) refresh ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
