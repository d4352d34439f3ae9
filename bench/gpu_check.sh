#!/usr/bin/env bash
# The GPU check (see bench/gpu_check.py): is this GPU machine healthy for ringcomm? Bounded to
# 6 minutes, at most three files in $OUT, summary.json rewritten after every stage. Uses the
# first of python3 and python that has torch (a machine may have a bare `python` next to the
# python3 that holds torch, or no python).
#
#   OUT=/tmp/out bash bench/gpu_check.sh             # on the GPU machine
#   OUT=/tmp/out bash bench/gpu_check.sh --dry-run   # anywhere: the stage logic, commands stubbed
#                                                    # (or RINGCOMM_GPU_CHECK_DRY=1)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=""
for candidate in python3 python; do
  # find_spec, not import: a torch import would take seconds of the 6 minutes.
  if command -v "$candidate" >/dev/null &&
     "$candidate" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
    PYTHON=$(command -v "$candidate")
    break
  fi
done
[ -n "$PYTHON" ] || PYTHON=$(command -v python3 || command -v python) ||
  { echo "no python3 or python on PATH"; exit 127; }
exec "$PYTHON" bench/gpu_check.py "$@"
