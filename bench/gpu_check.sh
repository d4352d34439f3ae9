#!/usr/bin/env bash
# One GPU check for a fresh single-GPU machine (no network): build in place, run the GPU tests
# on 2 and 4 ranks sharing the GPU, measure kernel and allreduce bandwidth, write JSON to $OUT.
# Every stage has its own time limit so the whole script stays under 6 minutes; a failing
# stage is recorded and the next one still runs.
#
#   OUT=/tmp/out bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export RINGCOMM_CUDA=1
export RINGCOMM_CUDA_ARCHS="${RINGCOMM_CUDA_ARCHS:-90}"   # this machine's GPU only: faster build
export RINGCOMM_BUILD_JOBS="${RINGCOMM_BUILD_JOBS:-$(nproc)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
declare -A RC

stage() {  # stage NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s, t=$((SECONDS - START))s)"
  timeout --kill-after=10 "$limit" "$@" > >(tee "$OUT/$name.log") 2>&1
  RC[$name]=$?
  echo "== $name rc=${RC[$name]} ($((SECONDS - START))s)"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1 || true
stage build 120 python setup.py build_ext --inplace
stage info 30 python -c "
import json, torch, ringcomm
from ringcomm import _C
info = dict(ringcomm.build_info())
info.update(torch=torch.__version__, torch_nccl=str(torch.cuda.nccl.version()),
            cuda_available=_C.cuda_available(), devices=_C.device_count())
try:
    import nvidia.nccl, os
    hint = os.path.join(list(nvidia.nccl.__path__)[0], 'lib')
except ImportError:
    hint = ''
info['nccl_library'], info['nccl_runtime_version'] = _C.nccl_library(hint)
print(json.dumps(info, indent=1))
json.dump(info, open('$OUT/info.json', 'w'), indent=1)"
RINGCOMM_TEST_WORLDS=2,4 stage tests 150 python -m pytest -q -x tests/test_gpu.py \
  --junitxml="$OUT/tests.xml"
stage kernels 45 python bench/gpu_kernels.py --mib 256 --json "$OUT/kernels.json"
stage allreduce2 50 python bench/gpu_allreduce.py --world 2 --mib 64 256 --json "$OUT/allreduce2.json"
stage allreduce4 50 python bench/gpu_allreduce.py --world 4 --mib 64 256 --json "$OUT/allreduce4.json"

python - "$OUT" "${RC[build]}" "${RC[info]}" "${RC[tests]}" "${RC[kernels]}" \
  "${RC[allreduce2]}" "${RC[allreduce4]}" "$((SECONDS - START))" <<'PY'
import json, os, sys
out = sys.argv[1]
names = ["build", "info", "tests", "kernels", "allreduce2", "allreduce4"]
summary = {"exit_codes": dict(zip(names, map(int, sys.argv[2:8]))), "seconds": int(sys.argv[8])}
for name in ("info", "kernels", "allreduce2", "allreduce4"):
    path = os.path.join(out, name + ".json")
    if os.path.exists(path):
        summary[name] = json.load(open(path))
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(summary["exit_codes"]), summary["seconds"], "s")
PY
