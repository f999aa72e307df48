# Sourced by scripts/bootstrap.sh and scripts/matrix.sh: the one place that picks the
# Python to build virtualenvs with.
# find_python: prints $PYTHON if set, else the first of python3.13 .. python3 that is
# >= 3.11; prints nothing (and returns 1) when there is none.
find_python() {
  if [ -n "${PYTHON:-}" ]; then
    printf '%s\n' "$PYTHON"
    return 0
  fi
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}
