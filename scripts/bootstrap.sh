#!/usr/bin/env bash
# Prepare this checkout on a fresh Debian machine (as root) or any machine with
# Python >= 3.11: redis-server (Debian's package, if none is installed), a
# virtualenv in .venv with the project and its test extras, and graphviz with the
# docs extra. Idempotent and quick when nothing changed. Sourced by scripts/demo.sh,
# scripts/test.sh and scripts/docs.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
APT_UPDATED=0

log() { printf '[bootstrap] %s\n' "$*" >&2; }

apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing $*, and this is not a Debian-like system: install it by hand"
    exit 1
  fi
  if [ "$(id -u)" != "0" ]; then
    log "missing $*: run as root (or install it by hand)"
    exit 1
  fi
  if [ "$APT_UPDATED" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

apt_download_tool() {
  # apt_download_tool PACKAGE PATH-IN-PACKAGE: extract one binary of a Debian package
  # into $VENV/bin without installing the package (or its service). Best effort.
  local pkg="$1" path="$2" tmp
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
  if [ "$APT_UPDATED" = 0 ] && [ "$(id -u)" = "0" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
    APT_UPDATED=1
  fi
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download -qq "$pkg" >/dev/null 2>&1 && dpkg-deb -x "$pkg"_*.deb root); then
    install -m 0755 "$tmp/root$path" "$VENV/bin/$(basename "$path")"
    log "took $(basename "$path") from Debian's $pkg package into $VENV/bin"
  fi
  rm -rf "$tmp"
  [ -x "$VENV/bin/$(basename "$path")" ]
}

# redis-server: the tests and the demo start their own on a free port.
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi

# Python >= 3.11 with venv.
# shellcheck source=scripts/find_python.sh
source "$ROOT/scripts/find_python.sh"
PYTHON="$(find_python || true)"
if [ -z "$PYTHON" ]; then
  apt_install python3 python3-venv
  PYTHON="$(command -v python3)"
fi
if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_install python3-venv
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# The test extras; with the test tools (scripts/test.sh, scripts/docs.sh) or under CI
# the docs extras too, since tests/test_docs.py builds the docs site with Sphinx.
DEFAULT_EXTRAS=test
if [ "${TEST_TOOLS:-0}" = 1 ] || [ -n "${CI:-}" ]; then
  DEFAULT_EXTRAS=test,docs
fi
EXTRAS="${EXTRAS:-$DEFAULT_EXTRAS}"
# Every dependency at the version constraints.txt names, so the tests' result depends on
# the checkout alone, not on what was released since (scripts/deps.sh refreshes the file
# and checks the newest releases and the declared floors).
STAMP="$VENV/.streams-sched-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)-${EXTRAS}"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  log "installing streams-sched[${EXTRAS}] into $VENV (versions from constraints.txt)"
  # pip's output goes to a log shown only on failure: setuptools prints a long warning on
  # every editable install, about folders named like the package, that a newcomer cannot act on
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip &&
         "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[${EXTRAS}]"; } >"$VENV/pip.log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$VENV/pip.log" >&2 || true
    log "pip install failed (the log above, also in $VENV/pip.log)"
    exit 1
  fi
  echo "$WANT" > "$STAMP"
fi

# Graphviz's `dot` draws the docs' diagrams (docs/diagrams/*.dot, through sphinx.ext.graphviz),
# so the docs extra brings Debian's graphviz package. Without it the docs build fails at the
# first diagram: an error under CI, a warning here (tests/test_docs.py then skips the build).
case ",$EXTRAS," in
  *,docs,*)
    if ! command -v dot >/dev/null 2>&1; then
      if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        apt_install graphviz
      elif [ -n "${CI:-}" ]; then
        log "ERROR: no graphviz (dot) for the docs' diagrams: apt-get install graphviz (as root)"
        exit 1
      else
        log "no graphviz (dot): the docs build cannot draw its diagrams (apt-get install graphviz, as root)"
      fi
    fi
    ;;
esac

# Debian's chromium for the browser tests (tests/test_browser.py), which drive it through
# scrapy-playwright with PLAYWRIGHT_LAUNCH_OPTIONS executable_path=/usr/bin/chromium:
# `playwright install` would download a browser of its own, which a machine without
# access to Playwright's CDN cannot do, and which no package manager keeps updated.
# The package lists are refreshed only when apt does not know the package yet.
install_chromium() {
  local why
  if [ -x /usr/bin/chromium ]; then
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    why="this is not a Debian-like system: install Chromium at /usr/bin/chromium by hand"
  elif [ "$(id -u)" != "0" ]; then
    why="run as root, or: sudo apt-get install chromium"
  else
    log "apt-get install chromium (the browser tests drive it)"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2; then
      log "chromium not found in the package lists: apt-get update, then again"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && APT_UPDATED=1
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >&2 || true
    fi
    [ -x /usr/bin/chromium ] && return 0
    why="apt-get install chromium failed (see above)"
  fi
  if [ -n "${CI:-}" ]; then
    log "ERROR: no /usr/bin/chromium for the browser tests: $why"
    exit 1
  fi
  log "no /usr/bin/chromium ($why): the browser tests will skip (fail under CI=1)"
}
if [ "${TEST_TOOLS:-0}" = 1 ] || [ -n "${CI:-}" ]; then
  install_chromium
fi

# Tools some tests call (scripts/test.sh sets TEST_TOOLS=1): promtool and the prometheus
# server (from Debian's prometheus package, extracted into the venv: the scaling signal's
# PromQL is evaluated by a real Prometheus) and systemd-analyze (Debian's systemd
# package). Best effort: without them those tests skip locally and fail under CI=1.
if [ "${TEST_TOOLS:-0}" = 1 ]; then
  if ! command -v promtool >/dev/null 2>&1 && [ ! -x "$VENV/bin/promtool" ]; then
    apt_download_tool prometheus /usr/bin/promtool || log "promtool unavailable: the alert-rule test will skip (fail under CI=1)"
  fi
  if ! command -v prometheus >/dev/null 2>&1 && [ ! -x "$VENV/bin/prometheus" ]; then
    apt_download_tool prometheus /usr/bin/prometheus || log "prometheus unavailable: the scaling-signal test will skip (fail under CI=1)"
  fi
  if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
      apt_install systemd || log "systemd-analyze unavailable: the unit check will skip (fail under CI=1)"
    else
      log "systemd-analyze unavailable (apt-get install systemd as root): the unit check will skip (fail under CI=1)"
    fi
  fi
fi
