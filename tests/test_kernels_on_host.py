"""The CUDA kernels that ship, executed on the CPU: csrc/cuda's kernel sources compiled a second
time by the host compiler (csrc/testing/cuda/kernels_on_host.h runs every block and thread of the
grid the real launch sizing chose, in a shuffled order), driven through the real CudaReducer by
tests/support/kernels_on_host/sweep.cc and checked bit for bit against the CPU reducer. Two builds: with
AddressSanitizer and UndefinedBehaviorSanitizer (a misaligned 16-byte vector access or a read
past an operand fails as it would fault on a GPU), and with every load and store of the kernels
reported to the sweep (each output byte written exactly once, nothing before an operand read).
Launch sizing as on an H200 (132 SMs), an A100 (108) and a single SM."""
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ringcomm import _C
from ringcomm.options import DEFAULTS

pytestmark = pytest.mark.system  # compiles the kernels with g++

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
SWEEP = ROOT / "tests" / "support" / "kernels_on_host" / "sweep.cc"

# The kernels and the reducer that launches them (setup.py's kernel_sources), built for the host.
KERNEL_SOURCES = sorted((CSRC / "cuda").glob("*.cu")) + [CSRC / "cuda" / "cuda_reducer.cc"]
# What else the sweep links: the grid runner, and the CPU reducer as the reference.
SUPPORT_SOURCES = [CSRC / "testing" / "cuda" / "kernels_on_host.cc"] + [
    CSRC / folder / name for folder, name in
    [("cpu", "cpu_reducer.cc"), ("cpu", "half_blocks.cc"), ("core", "types.cc"),
     ("core", "transport.cc"), ("core", "reducer.cc"), ("core", "algorithms.cc")]]

SANITIZERS = ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
              "-fno-omit-frame-pointer"]
# Every load and store of the kernels' files becomes a call of the sweep's __asan_* hooks.
WATCHED = ["-O2", "-fsanitize=kernel-address", "--param", "asan-instrumentation-with-call-threshold=0",
           "--param", "asan-stack=0", "--param", "asan-globals=0"]
VARIANTS = {
    "sanitized": {"kernels": SANITIZERS, "others": SANITIZERS, "link": SANITIZERS[1:], "defines": []},
    "watched": {"kernels": WATCHED, "others": ["-O2"], "link": [], "defines": ["-DRC_WATCH_ACCESSES"]},
}

cuda_include = _C.build_info().get("cuda_include")
if not cuda_include or not (Path(cuda_include) / "cuda_fp16.h").exists():
    pytest.skip("ringcomm was built without the CUDA toolkit, whose headers the kernels need",
                allow_module_level=True)


def _build(variant, folder):
    """Compiles one sweep binary (2 compilers at a time); cached by the sources' contents."""
    flags = VARIANTS[variant]
    common = ["-std=c++17", "-g", "-Wall", "-Wno-unknown-pragmas", f"-I{CSRC}",
              f"-I{CSRC / 'include'}", f"-I{cuda_include}"]
    shim = ["-include", "testing/cuda/kernels_on_host.h"]
    units = [(src, ["-x", "c++", *shim, *flags["kernels"]]) for src in KERNEL_SOURCES[:-1]]
    units += [(KERNEL_SOURCES[-1], ["-x", "c++", *shim, *flags["others"]])]
    units += [(SWEEP, [*shim, *flags["others"], *flags["defines"]])]
    units += [(src, flags["others"]) for src in SUPPORT_SOURCES]

    digest = hashlib.sha256(repr((common, units)).encode())
    for src in sorted(CSRC.rglob("*")) + [SWEEP]:
        if src.is_file():
            digest.update(src.read_bytes())
    binary = folder / f"sweep-{variant}-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary

    def compile_unit(unit):
        src, unit_flags = unit
        obj = folder / f"{variant}-{src.parent.name}-{src.name}.o"
        subprocess.run(["g++", *common, *unit_flags, "-c", str(src), "-o", str(obj)], check=True)
        return str(obj)

    with ThreadPoolExecutor(max_workers=2) as pool:
        objects = list(pool.map(compile_unit, units))
    subprocess.run(["g++", *flags["link"], *objects, "-o", str(binary), "-lpthread"], check=True)
    return binary


@pytest.fixture(scope="module")
def sweeps():
    folder = ROOT / "build" / "kernels_on_host"
    folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = dict(zip(VARIANTS, pool.map(lambda v: _build(v, folder), VARIANTS)))
    return built


# (SMs, resident blocks per SM): an H200, an A100, one SM (the smallest grid: counts go past two
# grid strides for every op). The large counts of the big grids take one op per dtype.
DEVICES = [(132, 4), (108, 3), (1, 3)]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("sms,resident", DEVICES, ids=["h200", "a100", "one_sm"])
def test_kernels_match_the_cpu_reducer_bit_for_bit(sweeps, variant, sms, resident):
    args = [str(sweeps[variant]), "--sms", str(sms), "--resident", str(resident),
            "--seed", str(sms * 7919 + resident), "--large-ops", "all" if sms == 1 else "first",
            "--nccl-sms", str(DEFAULTS["nccl_sms"])]
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-4000:]
    summary = result.stdout.strip().splitlines()[-1]
    print(variant, summary)
    assert " 0 failed" in summary and "cases" in summary, summary
    # The launch sizing that ships chose the grid: at most one wave of resident blocks on the SMs
    # left free (nccl_sms for NCCL), and every one of them ran.
    largest = int(summary.split("largest grid ")[1].split()[0])
    assert largest == max(sms - DEFAULTS["nccl_sms"], 1) * resident, summary
