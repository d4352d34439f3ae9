#!/usr/bin/env bash
# The prepared GPU check (see bench/gpu_check.py): bounded to 6 minutes, at most three files in
# $OUT, summary.json rewritten after every stage. Uses python, else python3.
#
#   OUT=/tmp/out bash bench/gpu_check.sh             # on the GPU machine
#   OUT=/tmp/out bash bench/gpu_check.sh --dry-run   # here: the stage logic, commands stubbed
#                                                    # (or RINGCOMM_GPU_CHECK_DRY=1)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=$(command -v python || command -v python3) || { echo "no python or python3 on PATH"; exit 127; }
exec "$PYTHON" bench/gpu_check.py "$@"
