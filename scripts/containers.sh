#!/usr/bin/env bash
# The container tests, on a fresh Debian machine as root: compose/Dockerfile built on a
# local Debian base, the Compose stack started with podman-compose and crawled through
# (a worker SIGKILLed, another stopped, Prometheus scraping everything), every command
# and probe of deploy/kubernetes run in the image, testcontainers on podman's socket.
#
#   scripts/containers.sh          setup, then the container tests (pytest -m containers)
#   scripts/containers.sh setup    only install podman & co. and make the base image
#   scripts/containers.sh clean    remove what an interrupted run left: the stack's
#                                  containers, pod, network, volumes and namespaces
#
# Extra arguments go to pytest. No registry serves images here, so the base image is made
# from Debian's packages (mmdebstrap, then podman import) and kept; the public images the
# compose file names are replaced by stand-ins built on it (tests/podman/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_IMAGE="localhost/streams-sched-test/debian-python:bookworm"
PROJECT="streams-sched"
# runc, cgroupfs and rlimits no higher than ours: see that file
export CONTAINERS_CONF="$ROOT/tests/podman/containers.conf"

say() { printf '[containers] %s\n' "$*" >&2; }

install_tools() {
  local missing=()
  command -v podman >/dev/null 2>&1 || missing+=(podman)
  command -v runc >/dev/null 2>&1 || missing+=(runc)
  [ -x /usr/lib/podman/netavark ] || missing+=(netavark)
  [ -x /usr/lib/podman/aardvark-dns ] || missing+=(aardvark-dns)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
  command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  [ "${#missing[@]}" = 0 ] && return 0
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    say "ERROR: missing ${missing[*]}: install them (as root on Debian: apt-get install ${missing[*]})"
    exit 1
  fi
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  # netavark and aardvark-dns: podman's bridge networks with DNS (the compose services
  # find each other by name); iptables: netavark's NAT and published ports
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

make_base() {
  if podman image exists "$BASE_IMAGE"; then
    return 0
  fi
  # Debian bookworm's python3 is 3.11, as in python:3.11-slim; python3-venv for the
  # Dockerfile's `python3 -m venv`. No documentation, manual pages or translations.
  say "making $BASE_IMAGE with mmdebstrap (about 20-100 s, from Debian's mirror)"
  local started=$SECONDS
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm - | podman import - "$BASE_IMAGE" >/dev/null
  say "made $BASE_IMAGE in $((SECONDS - started)) s: $(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") bytes"
}

check_runs() {
  # The first container tells whether this machine can run containers at all.
  local out
  if ! out="$(podman run --rm --network none "$BASE_IMAGE" python3 -c 'print("ok")' 2>&1)" || [ "$out" != "ok" ]; then
    say "ERROR: podman cannot run a container here: $out"
    exit 1
  fi
}

clean() {
  local name
  for name in $(podman ps -a --filter "label=com.docker.compose.project=$PROJECT" --format '{{.Names}}'); do
    podman rm -f -t 0 "$name" >/dev/null
  done
  podman pod rm -f "pod_$PROJECT" >/dev/null 2>&1 || true
  for name in $(podman network ls --format '{{.Name}}' | grep "^${PROJECT}_" || true); do
    podman network rm -f "$name" >/dev/null
  done
  for name in $(podman volume ls --format '{{.Name}}' | grep "^${PROJECT}_" || true); do
    podman volume rm -f "$name" >/dev/null
  done
  for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^streams-sched-stack-' || true); do
    ip netns delete "$name"
  done
}

started=$SECONDS
case "${1:-test}" in
  setup)
    install_tools
    make_base
    check_runs
    say "ready in $((SECONDS - started)) s"
    ;;
  clean)
    clean
    ;;
  test | -*)
    [ "${1:-}" = test ] && shift
    install_tools
    make_base
    check_runs
    say "set up in $((SECONDS - started)) s"
    TEST_TOOLS=1 source "$ROOT/scripts/bootstrap.sh"
    cd "$ROOT"
    "$VENV/bin/python" -m pytest -m containers "$@"
    say "passed in $((SECONDS - started)) s"
    ;;
  *)
    say "usage: $0 [setup | clean | test [PYTEST ARGS...]]"
    exit 2
    ;;
esac
