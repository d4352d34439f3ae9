"""The probe programs the GPU check's stages run with `python -c`: what the machine has (the env
stage) and what the built ringcomm sees (the info stage). Each prints its findings as JSON on a
marked last line, which the check reads into summary.json."""

# Printed by the environment stage, and parsed from its last line into the summary.
ENV_PROBE = r"""
import ctypes, json, os, shutil, subprocess, sys
import platform
info = {"python": sys.executable, "python_version": platform.python_version(),
        "which": {c: shutil.which(c) for c in ("python", "python3", "nvcc", "compute-sanitizer")},
        "cuda_home": os.environ.get("CUDA_HOME")}
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=15).stdout.strip()
    except Exception as error:
        return f"unavailable: {error}"
info["nvidia_smi"] = run("nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                         "--format=csv,noheader")
info["nvcc"] = run("nvcc", "--version").splitlines()[-1:] if shutil.which("nvcc") else None
for module in ("torch", "pybind11", "setuptools", "pytest", "pytest_timeout", "cupy", "numpy"):
    try:
        info[module] = getattr(__import__(module), "__version__", "present")
    except Exception as error:
        info[module] = None
try:
    import torch
    info["torch_cuda"] = torch.version.cuda
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    info["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if info["gpu"] else None
except Exception as error:
    info["torch_error"] = repr(error)
# The NCCL this process loads the way ringcomm does (after torch, so torch's copy if it has one).
def load_nccl():
    candidates = [os.environ.get("RINGCOMM_NCCL_LIBRARY"), "libnccl.so.2"]
    try:
        import nvidia.nccl
        candidates.append(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))
    except ImportError:
        pass
    for name in filter(None, candidates):
        if os.path.isdir(name):
            name = os.path.join(name, "libnccl.so.2")
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
lib = load_nccl()
if lib is not None:
    code = ctypes.c_int(0)
    lib.ncclGetVersion(ctypes.byref(code))
    info["nccl_loaded_version"] = code.value
    maps = open("/proc/self/maps").read().splitlines()
    info["nccl_loaded_path"] = next((l.split()[-1] for l in maps if "libnccl.so" in l), None)
    # The multi-rank-per-GPU path the tests and benchmarks take (cuda_backend.shared_gpu_env,
    # which also sets NCCL_NVLS_ENABLE=0, NCCL_MNNVL_ENABLE=0 and NCCL_MAX_CTAS=8 on both).
    info["multi_rank_path"] = ("NCCL_MULTI_RANK_GPU_ENABLE=1" if code.value >= 23003 else
                               "NCCL_HOSTID per rank, NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1 "
                               "(sockets)")
print(json.dumps(info, indent=1))
print("ENV_JSON " + json.dumps(info))
"""

INFO_PROBE = r"""
import json, ringcomm
from ringcomm import _C, cuda_backend
info = dict(ringcomm.build_info())
info["cuda_available"] = _C.cuda_available()
info["devices"] = _C.device_count()
info["nccl_library"], info["nccl_runtime_version"] = _C.nccl_library(**cuda_backend.nccl_search())
print("INFO_JSON " + json.dumps(info))
"""

# The probes by stage, for the plan.
PROBES = {"env": ENV_PROBE, "info": INFO_PROBE}
