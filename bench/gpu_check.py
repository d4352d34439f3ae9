"""The GPU check: is this GPU machine healthy for ringcomm?

One bounded run on a single-GPU machine: it builds ringcomm in place, runs its GPU tests and
benchmarks, and writes a verdict with everything needed to read it.

Stages run in order under one global deadline (default 345 s, so the whole check with its
kill-after slack and the final bundling stays under 6 minutes), correctness first: the plan, its
limits (from the cost of a launch of ranks and of each test) and the verdict rules are
bench/gpu_check_plan.py; bench/gpu_check_fit.py checks that plan against the GPU machine it is
written for. A stage that fails is recorded and the next one still runs, except after a failed
build (nothing left to test); a stage past its limit is interrupted (SIGINT: pytest still reports
what ran), then killed KILL_AFTER seconds later. A test stage's launch of ranks is told the
stage's deadline, so its tests report before the stage is cut.

$OUT receives three files, each rewritten after every stage, so a run cut short still reports:
summary.json (verdict "pass", "fail" or "incomplete"; the plan's table and any problem with it;
tests_planned in run order; per stage its exit code, seconds and what ran, passed, failed and
skipped; results), check.log (every stage's output, its head if huge) and bundle.tar.gz (JUnit
XML, each test stage's launches.jsonl with what every launch and check took, NCCL_DEBUG=INFO
files, per-stage JSON; kept under MAX_BUNDLE_BYTES by cutting the NCCL logs shorter, so the
three stay easy to copy off the machine).

MPS is off unless RINGCOMM_GPU_CHECK_MPS=1: then it starts after the build, and only stays when
an NCCL all_reduce between two ranks ran under it (that probe costs a launch of the budget).

    OUT=/tmp/out bash bench/gpu_check.sh            # the real check, on a GPU machine
    OUT=/tmp/out bash bench/gpu_check.sh --dry-run  # the stage logic anywhere, commands stubbed
    OUT=/tmp/out bash bench/gpu_check.sh --dry-run --fail-stage build   # a simulated failure

The build needs pybind11. On a GPU machine without it and without network, copy it into
build/pydeps from one that has it:
cp -r "$(python -c 'import pybind11, os; print(os.path.dirname(pybind11.__file__))')" build/pydeps/
(the check puts build/pydeps on PYTHONPATH whenever that folder exists).

Only the standard library here: the probes that need torch or ringcomm run as stages.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_fit  # noqa: E402
from gpu_check_plan import (BUDGET, REPORT_S, plan, planned_tests, stage_counts,  # noqa: E402
                            table, verdict)

ROOT = Path(__file__).resolve().parent.parent
KILL_AFTER = 5
# Build-time Python packages a machine without network may lack (pybind11 is no dependency of
# torch): copied here by hand (an ignored folder), on every stage's path when present.
PYDEPS = ROOT / "build" / "pydeps"
MAX_DEBUG_BYTES = 2 << 20  # per NCCL debug file in the bundle, at first (see write)
MAX_BUNDLE_BYTES = 15 << 20
# check.log: stage output past this is left out (the check's own "==" lines stay)
MAX_LOG_BYTES = 12 << 20
OUTPUT_FILES = ("summary.json", "check.log", "bundle.tar.gz")

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

# Run under MPS right after its daemon starts: an NCCL all_reduce between two ranks sharing the
# GPU, as the tests' ranks will. A server that cannot serve (a container without the rights it
# needs), or NCCL that fails under it, would otherwise fail every later stage: the whole check.
MPS_PROBE = r"""
import os, sys, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
from ringcomm import cuda_backend

def rank(r, world, store):
    os.environ.update(cuda_backend.shared_gpu_env(r))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=r, world_size=world,
                            device_id=torch.device("cuda", 0))
    x = torch.full((1 << 20,), r + 1.0, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    assert bool(torch.all(x == world * (world + 1) / 2)), "wrong sum under MPS"
    dist.destroy_process_group()

if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(rank, args=(2, os.path.join(tmp, "store")), nprocs=2, join=True)
"""
MPS_PROBE_S = 45  # a launch of two ranks and one NCCL communicator, with room

INFO_PROBE = r"""
import json, ringcomm
from ringcomm import _C, cuda_backend
info = dict(ringcomm.build_info())
info["cuda_available"] = _C.cuda_available()
info["devices"] = _C.device_count()
info["nccl_library"], info["nccl_runtime_version"] = _C.nccl_library(**cuda_backend.nccl_search())
print("INFO_JSON " + json.dumps(info))
"""


def cuda_home():
    """CUDA_HOME (or CUDA_PATH) from the environment, else from nvcc's real path
    (toolkit/bin/nvcc), else the conventional folder (nvcc may be a wrapper script)."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(name):
            return os.environ[name]
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(os.path.realpath(nvcc)).parent.parent
        if (home / "include" / "cuda_runtime_api.h").exists():
            return str(home)
    return "/usr/local/cuda"


def find_tool(name, cuda_home):
    """A CUDA tool on PATH or in the toolkit's bin folder (which need not be on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(cuda_home) / "bin" / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


def dry_junit(stage, failing):
    """A stand-in JUnit file: the stage's tests, all passed, or the first failed."""
    cases = "".join(
        f'<testcase classname="dry" name="{test}">'
        + ('<failure message="simulated"/>' if failing and i == 0 else "") + "</testcase>"
        for i, test in enumerate(stage.tests))
    return (f'<testsuites><testsuite tests="{len(stage.tests)}" failures="{int(failing)}" '
            f'errors="0" skipped="0">{cases}</testsuite></testsuites>')


def dry_stub(stage, work, python, failing=False):
    """What a stage runs in a dry run: it says what it would run and writes a stand-in result,
    so the bookkeeping (limits, summary, verdict, bundle) is exercised without a GPU. A
    `failing` stage exits 1 (its first test fails)."""
    stand_in = json.dumps({"dry_run": True})
    lines = [f"print('dry run: would run', {' '.join(stage.argv[:6])!r}, flush=True)"]
    if stage.result:
        lines.append(f"open({str(work / stage.result)!r}, 'w').write({stand_in!r})")
    if stage.junit:
        lines.append(f"open({str(work / stage.junit)!r}, 'w').write({dry_junit(stage, failing)!r})")
    if stage.marker:
        lines.append(f"print({stage.marker + stand_in!r})")
    seconds = float(os.environ.get("RINGCOMM_GPU_CHECK_DRY_SLEEP", "0"))
    lines.append(f"import time; time.sleep({seconds})")
    if failing:
        lines.append("raise SystemExit('dry run: simulated failure')")
    return [python, "-c", "\n".join(lines)]


def junit_counts(path):
    """{tests, failures, errors, skipped, failed: [names]} from a JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        return {"unreadable": str(error)}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    counts["failed"] = [f"{case.get('classname')}::{case.get('name')}"
                        for case in root.iter("testcase")
                        if case.find("failure") is not None or case.find("error") is not None]
    # Skipped because their shared launch ran out of time (tests/shared_launch.py says "cut
    # short"): the stage was cut short, not passed.
    counts["cut_short"] = [f"{case.get('classname')}::{case.get('name')}"
                           for case in root.iter("testcase")
                           for skip in case.findall("skipped")
                           if "cut short:" in (skip.get("message") or "")]
    return counts


class Check:
    def __init__(self, out, python, dry=False, budget=BUDGET, on_summary=None, fail_stage=None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.python = python
        self.dry = dry
        self.fail_stage = fail_stage
        self.stages = []
        self.tools = {}  # CUDA tools optional stages need: name -> path, None where absent
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.on_summary = on_summary
        self.log = open(self.out / "check.log", "w")
        self.summary = {"verdict": "incomplete", "dry_run": dry, "budget_s": budget,
                        "tests_planned": [], "stages": [], "results": {},
                        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    def elapsed(self):
        return round(time.monotonic() - self.start, 1)

    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def environment(self):
        env = dict(os.environ)
        env.update(CUDA_HOME=cuda_home(), RINGCOMM_CUDA="1",
                   RINGCOMM_CUDA_ARCHS=os.environ.get("RINGCOMM_CUDA_ARCHS", "90"),
                   RINGCOMM_BUILD_JOBS=os.environ.get("RINGCOMM_BUILD_JOBS", str(os.cpu_count())),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH"),
                                                             str(PYDEPS) if PYDEPS.is_dir() else None])),
                   NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "INFO"),
                   NCCL_DEBUG_FILE=str(self.work / "nccl.%h.%p.log"))
        return env

    @staticmethod
    def wants_mps():
        """MPS only when asked: not yet shown to work with NCCL on the machine the check is
        written for, its probe costs a launch, and a broken server would take every later stage
        with it."""
        return os.environ.get("RINGCOMM_GPU_CHECK_MPS") == "1"

    def start_mps(self, env):
        """MPS lets ranks sharing the GPU run kernels at once instead of time-sliced; it is kept
        only when an NCCL all_reduce ran under it."""
        control = shutil.which("nvidia-cuda-mps-control")
        if self.dry or control is None:
            return "not started" + (" (dry run)" if self.dry else
                                    " (nvidia-cuda-mps-control not found)")
        pipes = self.work / "mps"
        pipes.mkdir(exist_ok=True)
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipes), CUDA_MPS_LOG_DIRECTORY=str(pipes))
        try:
            proc = subprocess.run([control, "-d"], env=env, capture_output=True, text=True,
                                  timeout=10)
        except Exception as error:
            proc, why = None, f"failed to start: {error}"
        else:
            why = f"failed to start (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
        if proc is None or proc.returncode != 0:
            for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                env.pop(key)
            return why
        self.mps_control = (control, env.copy())
        probe = self.work / "mps_probe.py"  # a file: spawned ranks import their function by name
        probe.write_text(MPS_PROBE)
        try:
            run = subprocess.run([self.python, str(probe)], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=MPS_PROBE_S,
                                 start_new_session=True)
            why = f"rc {run.returncode}: {run.stderr.strip()[-300:]}"
            usable = run.returncode == 0
        except subprocess.TimeoutExpired:
            why, usable = f"an NCCL all_reduce took over {MPS_PROBE_S} s", False
        if not usable:  # without MPS the ranks are time-sliced, but they run
            self.stop_mps()
            self.mps_control = (None, None)
            for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                env.pop(key)
            return f"started but unusable ({why}): stopped, running without MPS"
        return "started (an NCCL all_reduce ran under it)"

    def stop_mps(self):
        control, env = getattr(self, "mps_control", (None, None))
        if control:
            try:  # never in the way of the final summary
                subprocess.run([control], input="quit\n", env=env, text=True, timeout=10,
                               capture_output=True)
            except Exception as error:
                self.say(f"== stopping MPS failed: {error}")

    def run_stage(self, stage, env):
        left = self.deadline - time.monotonic() - KILL_AFTER
        record = {"name": stage.name, "limit_s": stage.limit, "start_s": self.elapsed()}
        if left < (stage.limit if stage.optional else 5):
            record.update(rc=None, skipped=f"not enough time left ({left:.0f} s)")
            self.say(f"== {stage.name}: skipped, {left:.0f} s left")
            return self.finish(stage, record, "")
        if stage.tool and not self.tools.get(stage.tool) and not self.dry:
            record.update(rc=None, skipped=f"{stage.tool} not found")
            self.say(f"== {stage.name}: skipped, {stage.tool} not found")
            return self.finish(stage, record, "")
        limit = min(stage.limit, left)
        stage_env = {**env, **stage.env}
        if stage.junit:  # its shared launches end in time for pytest to report them
            stage_env["RINGCOMM_TEST_ENDS_AT"] = str(time.time() + limit - REPORT_S)
        failing = self.dry and stage.name == self.fail_stage
        stub = self.dry and (stage.needs_gpu or failing)
        argv = dry_stub(stage, self.work, self.python, failing) if stub else stage.argv
        self.say(f"== {stage.name} (limit {limit:.0f} s, t={self.elapsed()} s)"
                 f"{' stubbed (dry run)' if argv is not stage.argv else ''}: "
                 f"{' '.join(stage.argv)[:200]}")
        proc = subprocess.Popen(argv, cwd=ROOT, env=stage_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)  # its own group: the whole tree is killed
        output = []
        reader = threading.Thread(target=self.copy_output, args=(proc.stdout, output), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGINT, not SIGTERM: pytest stops at KeyboardInterrupt and still writes its JUnit
            # XML and -rA summary (which tests ran, the failures' tracebacks); SIGTERM loses both.
            self.signal(proc, signal.SIGINT)
            try:
                proc.wait(KILL_AFTER)
            except subprocess.TimeoutExpired:
                self.signal(proc, signal.SIGKILL)
                try:
                    proc.wait(KILL_AFTER)
                except subprocess.TimeoutExpired:  # unkillable (stuck in the driver): move on
                    record["unreaped"] = True
        self.signal(proc, signal.SIGKILL)  # ranks a failed test left behind hold the GPU
        reader.join(KILL_AFTER)
        record.update(rc=proc.returncode, timed_out=timed_out)
        self.say(f"== {stage.name} rc={proc.returncode}{' (timed out)' if timed_out else ''} "
                 f"t={self.elapsed()} s")
        return self.finish(stage, record, "".join(output))

    def copy_output(self, stream, output):
        for line in stream:
            output.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
            if self.log.tell() < MAX_LOG_BYTES:
                self.log.write(line)
                self.log.flush()

    @staticmethod
    def signal(proc, sig):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def finish(self, stage, record, output):
        record["seconds"] = round(self.elapsed() - record["start_s"], 1)
        self.summary["stages"].append(record)
        if stage.marker:
            for line in output.splitlines():
                if line.startswith(stage.marker):
                    self.summary["results"][stage.name] = json.loads(line[len(stage.marker):])
        if stage.result and (self.work / stage.result).exists():
            try:
                self.summary["results"][stage.name] = json.loads((self.work / stage.result).read_text())
            except ValueError as error:
                self.summary["results"][stage.name] = {"unreadable": str(error)}
        junit = None
        if stage.junit and (self.work / stage.junit).exists():
            junit = self.summary["results"][stage.name] = junit_counts(self.work / stage.junit)
        record["counts"] = stage_counts(record, junit)
        self.summary["verdict"] = self.verdict() if self.summary.get("finished") else "incomplete"
        self.write()
        return record

    def write(self):
        """summary.json and bundle.tar.gz, each replaced atomically: a kill leaves the last one."""
        self.summary["seconds"] = self.elapsed()
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1))
        tmp.replace(self.out / "summary.json")
        tmp = self.out / "bundle.tar.gz.tmp"
        cap = MAX_DEBUG_BYTES
        while True:  # over MAX_BUNDLE_BYTES: the NCCL logs are cut shorter
            self.bundle(tmp, cap)
            if tmp.stat().st_size <= MAX_BUNDLE_BYTES or cap < 1024:
                break
            cap //= 4
        tmp.replace(self.out / "bundle.tar.gz")
        if self.on_summary:
            self.on_summary(json.loads((self.out / "summary.json").read_text()))

    def bundle(self, path, cap):
        """Every work file into a tar.gz; a file over `cap` bytes (a huge NCCL log) only its
        head: that says what matters."""
        with tarfile.open(path, "w:gz") as bundle:
            for file in sorted(self.work.iterdir()):
                if file.is_file() and file.stat().st_size <= cap:
                    bundle.add(file, arcname=file.name)
                elif file.is_file():
                    cut = self.work / (file.name + ".head")  # listed already: not re-added
                    with open(file, "rb") as src:
                        cut.write_bytes(src.read(cap))
                    bundle.add(cut, arcname=file.name + ".head")
                    cut.unlink()

    def run(self):
        env = self.environment()
        self.summary["cuda_home"] = env["CUDA_HOME"]
        self.summary["mps"] = ("not started yet (after the build)" if self.wants_mps() else
                               "off (the default; RINGCOMM_GPU_CHECK_MPS=1 tries it)")
        self.tools = {"compute-sanitizer": find_tool("compute-sanitizer", env["CUDA_HOME"])}
        self.summary["tools"] = self.tools
        self.say(f"== gpu_check: python {self.python}, CUDA_HOME {env['CUDA_HOME']}, "
                 f"MPS {self.summary['mps']}, dry run {self.dry}")
        try:
            probes = {"env": ENV_PROBE, "info": INFO_PROBE}
            self.stages = plan(self.python, self.work, probes,
                               pytest_timeout=self.dry or self.has_pytest_timeout(env),
                               tools=self.tools)
            self.check_plan()
            self.summary["tests_planned"] = planned_tests(self.stages)
            build_failed = False
            for stage in self.stages:
                if build_failed:  # nothing to test: every later stage would only skip
                    self.finish(stage, {"name": stage.name, "limit_s": stage.limit,
                                        "start_s": self.elapsed(), "rc": None,
                                        "skipped": "build failed"}, "")
                    continue
                record = self.run_stage(stage, env)
                if stage.name == "env":
                    found = self.summary["results"].get("env", {})
                    self.summary["multi_rank_path"] = found.get("multi_rank_path", "unknown")
                    self.summary["plan"]["machine_differences"] = gpu_check_fit.differences(
                        gpu_check_fit.MACHINE, found, self.tools)
                if stage.name == "build" and record.get("rc") != 0:
                    build_failed = True
                    self.say("== build failed: the later stages are not run")
                if stage.name == "info" and self.wants_mps():
                    # After the build: the probe's ranks use ringcomm's shared_gpu_env.
                    self.summary["mps"] = self.start_mps(env)
                    self.say(f"== MPS: {self.summary['mps']}")
        finally:
            self.stop_mps()
            self.summary["finished"] = True
            self.summary["verdict"] = self.verdict()
            self.write()
            self.log.close()
            shutil.rmtree(self.work, ignore_errors=True)
        return self.summary

    def check_plan(self):
        """The plan's arithmetic and its fit to the GPU machine (bench/gpu_check_fit.py): a dry
        run fails on any problem; a real run records them (its stages show the rest)."""
        problems = gpu_check_fit.problems(self.stages)
        self.summary["plan"] = {"table": table(self.stages), "problems": problems,
                                "machine": gpu_check_fit.MACHINE, "machine_differences": []}
        width = max(len(s.name) for s in self.stages)
        for row in self.summary["plan"]["table"]:
            self.say(f"== plan: {row['stage']:<{width}} launches {row['launches']}  limit "
                     f"{row['limit_s']:>5g} s = {row['from']}"
                     + ("  (optional)" if row["optional"] else ""))
        for problem in problems:
            self.say(f"== plan problem: {problem}")

    def verdict(self):
        if self.dry and self.summary.get("plan", {}).get("problems"):
            return "fail"
        return verdict(self.stages, self.summary["stages"])

    def has_pytest_timeout(self, env):
        probe = subprocess.run([self.python, "-c", "import pytest_timeout"], env=env,
                               capture_output=True)
        if probe.returncode != 0:
            self.say("== pytest-timeout is not installed: the stage limit bounds the tests")
        return probe.returncode == 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "gpu_check_out")))
    parser.add_argument("--dry-run", action="store_true",
                        default=os.environ.get("RINGCOMM_GPU_CHECK_DRY", "") not in ("", "0"))
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for all stages")
    parser.add_argument("--fail-stage", help="dry run: make this stage fail (its first test)")
    args = parser.parse_args()
    if args.fail_stage and not args.dry_run:
        parser.error("--fail-stage only simulates a failure in a dry run (--dry-run)")
    summary = Check(args.out, sys.executable, args.dry_run, args.budget,
                    fail_stage=args.fail_stage).run()
    codes = {s["name"]: s.get("rc") for s in summary["stages"]}
    print(f"verdict: {summary['verdict']};", json.dumps(codes), summary["seconds"], "s; files:",
          sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
