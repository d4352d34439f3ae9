"""Check a GPU machine for ringcomm in one run of bounded time.

It builds ringcomm in place, runs its GPU tests and benchmarks, correctness first, and gives a
verdict: pass, fail or incomplete.

    python tools/gpu_check.py --out /tmp/gpu_check           # on a GPU machine: 6 minutes at most
    python tools/gpu_check.py --dry-run                      # anywhere: the GPU stages stubbed
    python tools/gpu_check.py --dry-run --fail-stage build   # ... and one failing

What runs, in what order and for how long is tools/gpu_check_plan.py; the machine it is planned
for, tools/gpu_machine.py (a dry run fails where the plan does not fit it). A failed stage is
recorded and the next still runs, except after a failed build; a stage past its limit is
interrupted (pytest still reports what ran), then killed. The output folder (--out, else $OUT)
gets three files, rewritten after every stage so that a run cut short still reports:
summary.json (the verdict, the plan, per stage what ran, passed, failed, skipped), check.log
(every stage's output) and bundle.tar.gz (JUnit XML, each test stage's launches.jsonl with what
every launch and check took, NCCL logs, per-stage JSON).

Stages run under the first of this Python, python3 and python that has torch. The build needs
pybind11: without network, copy it into build/pydeps, which every stage has on its path.
Only the standard library here: what needs torch or ringcomm runs as a stage.
"""
import argparse
import importlib.util
import io
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check_plan import (REPORT_S, TIME_LIMIT, dry_stub, junit_counts, plan,  # noqa: E402
                            planned_tests, problems, stage_counts, table, verdict)
import gpu_machine  # noqa: E402
from gpu_machine import differences, env_probe, info_probe  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KILL_AFTER = 5
PYDEPS = ROOT / "build" / "pydeps"  # build-time packages copied by hand (pybind11)
MAX_LOG_BYTES = 12 << 20  # check.log: stage output past this is left out
MAX_BUNDLE_BYTES = gpu_machine.MACHINE["output_file_bytes_max"]
MAX_DEBUG_BYTES = 2 << 20  # per NCCL log in the bundle, at first
OUTPUT_FILES = ("summary.json", "check.log", "bundle.tar.gz")


def has_module(python, name, env=None):
    """Whether `python` finds the module `name` (without importing it: torch takes seconds)."""
    code = f"import importlib.util as u, sys; sys.exit(u.find_spec({name!r}) is None)"
    return subprocess.run([python, "-c", code], env=env, capture_output=True).returncode == 0


def python_with_torch():
    """This Python if it has torch, else the first python3 or python on PATH that has it."""
    if importlib.util.find_spec("torch"):
        return sys.executable
    found = [shutil.which(name) for name in ("python3", "python")]
    return next((python for python in found if python and has_module(python, "torch")),
                sys.executable)


def cuda_home():
    """CUDA_HOME (or CUDA_PATH), else the toolkit nvcc really is in (toolkit/bin/nvcc), else the
    conventional folder (nvcc may be a wrapper script)."""
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
    candidate = Path(cuda_home) / "bin" / name
    return shutil.which(name) or (str(candidate) if os.access(candidate, os.X_OK) else None)


class Mps:
    """The MPS control daemon: ranks sharing the GPU run kernels at once instead of time-sliced.
    Kept only when two ranks ran an NCCL all_reduce right under it (bench/gpu_allreduce.py): a
    server that cannot serve would fail every later stage."""
    PROBE_S = 45  # a launch of two ranks and their communicators, with room
    VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")

    def __init__(self, python, work, dry, say):
        self.python, self.work, self.dry, self.say = python, work, dry, say
        self.control = (None, None)  # (nvidia-cuda-mps-control, its environment) while it runs

    def start(self, env):
        """Starts the daemon; `env`, the stages' environment, keeps its variables while it is
        kept. Returns what happened, in words."""
        control = shutil.which("nvidia-cuda-mps-control")
        if self.dry or control is None:
            return "not started" + (" (dry run)" if self.dry else
                                    " (nvidia-cuda-mps-control not found)")
        (self.work / "mps").mkdir(exist_ok=True)
        env.update(dict.fromkeys(self.VARIABLES, str(self.work / "mps")))  # pipes and logs
        why = self.run([control, "-d"], env, 10)
        if why is None:
            self.control = (control, env.copy())
            out = self.work / "mps_probe.json"
            why = self.run([self.python, "bench/gpu_allreduce.py", "--world", "2", "--mib", "1",
                            "--iters", "1", "--warmup", "1", "--slices-mib", "1", "--json",
                            str(out)], env, self.PROBE_S)
            rows = json.loads(out.read_text())["rows"] if out.exists() else []
            if why is None and rows and all(row["correct"] for row in rows):
                return "started (an NCCL all_reduce ran under it)"
            self.stop()  # without MPS the ranks are time-sliced, but they run
            why = f"started but unusable ({why or f'results {rows}'}): stopped, running without MPS"
        for key in self.VARIABLES:
            env.pop(key)
        return why

    @staticmethod
    def run(argv, env, timeout):
        """None when `argv` ran and exited 0, else why not."""
        try:
            proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout, start_new_session=True)
        except (OSError, subprocess.SubprocessError) as error:
            return str(error)[:300]
        return None if proc.returncode == 0 else f"rc {proc.returncode}: {proc.stderr[-300:]}"

    def stop(self):
        control, env = self.control
        self.control = (None, None)
        if control:
            try:  # never in the way of the final summary
                subprocess.run([control], input="quit\n", env=env, text=True, timeout=10,
                               capture_output=True)
            except (OSError, subprocess.SubprocessError) as error:
                self.say(f"== stopping MPS failed: {error}")


class Check:
    """One run of the check: the plan's stages in order under one deadline, each recorded in the
    summary as it ends."""

    def __init__(self, out, python, dry=False, time_limit=TIME_LIMIT, on_summary=None,
                 fail_stage=None, mps=False):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.python, self.dry, self.fail_stage = python, dry, fail_stage
        self.on_summary = on_summary
        self.stages, self.tools = [], {}  # tools: CUDA programs optional stages need, or None
        self.start = time.monotonic()
        self.deadline = self.start + time_limit
        self.log = open(self.out / "check.log", "w")
        self.want_mps = mps
        self.mps = Mps(python, self.work, dry, self.say)
        self.summary = {"verdict": "incomplete", "dry_run": dry, "time_limit_s": time_limit,
                        "tests_planned": [], "stages": [], "results": {},
                        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}

    def elapsed(self):
        return round(time.monotonic() - self.start, 1)

    def say(self, text):
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def environment(self):
        env, machine = dict(os.environ), gpu_machine.MACHINE
        path = [str(ROOT), os.environ.get("PYTHONPATH"), str(PYDEPS) if PYDEPS.is_dir() else None]
        env.update(CUDA_HOME=cuda_home(), RINGCOMM_CUDA="1",
                   RINGCOMM_CUDA_ARCHS=os.environ.get("RINGCOMM_CUDA_ARCHS", machine["cuda_arch"]),
                   RINGCOMM_BUILD_JOBS=os.environ.get("RINGCOMM_BUILD_JOBS", str(os.cpu_count())),
                   PYTHONPATH=os.pathsep.join(filter(None, path)),
                   NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "INFO"),
                   NCCL_DEBUG_FILE=str(self.work / "nccl.%h.%p.log"))
        return env

    def run_stage(self, stage, env):
        left = self.deadline - time.monotonic() - KILL_AFTER
        record = {"name": stage.name, "limit_s": stage.limit, "start_s": self.elapsed()}
        skip = None
        if left < (stage.limit if stage.optional else 5):
            skip = f"not enough time left ({left:.0f} s)"
        elif stage.tool and not self.tools.get(stage.tool) and not self.dry:
            skip = f"{stage.tool} not found"
        if skip:
            self.say(f"== {stage.name}: skipped, {skip}")
            return self.finish(stage, {**record, "rc": None, "skipped": skip})
        limit = min(stage.limit, left)
        stage_env = {**env, **stage.env}
        if stage.junit:  # its shared launches end in time for pytest to report them
            stage_env["RINGCOMM_TEST_ENDS_AT"] = str(time.time() + limit - REPORT_S)
        failing = self.dry and stage.name == self.fail_stage
        stub = self.dry and (stage.needs_gpu or failing)
        argv = dry_stub(stage, self.work, self.python, failing) if stub else stage.argv
        self.say(f"== {stage.name} (limit {limit:.0f} s, t={self.elapsed()} s)"
                 f"{' stubbed (dry run)' if stub else ''}: {' '.join(stage.argv)[:200]}")
        proc = subprocess.Popen(argv, cwd=ROOT, env=stage_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace",
                                start_new_session=True)  # its own group: the whole tree is killed
        reader = threading.Thread(target=self.copy_output, args=(proc.stdout,), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            # SIGINT, not SIGTERM: pytest stops at KeyboardInterrupt and still writes its JUnit
            # XML and -rA summary (which tests ran, the failures' tracebacks); SIGTERM loses both.
            for sig in (signal.SIGINT, signal.SIGKILL):
                self.signal(proc, sig)
                try:
                    proc.wait(KILL_AFTER)
                    break
                except subprocess.TimeoutExpired:
                    pass
            else:  # unkillable (stuck in the driver): move on
                record["unreaped"] = True
        self.signal(proc, signal.SIGKILL)  # ranks a failed test left behind hold the GPU
        reader.join(KILL_AFTER)
        record.update(rc=proc.returncode, timed_out=timed_out)
        self.say(f"== {stage.name} rc={proc.returncode}{' (timed out)' if timed_out else ''} "
                 f"t={self.elapsed()} s")
        return self.finish(stage, record)

    def copy_output(self, stream):
        for line in stream:
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

    def finish(self, stage, record):
        record["seconds"] = round(self.elapsed() - record["start_s"], 1)
        self.summary["stages"].append(record)
        results = self.summary["results"]
        if stage.result and (self.work / stage.result).exists():
            try:
                results[stage.name] = json.loads((self.work / stage.result).read_text())
            except ValueError as error:
                results[stage.name] = {"unreadable": str(error)}
        junit = None
        if stage.junit and (self.work / stage.junit).exists():
            junit = results[stage.name] = junit_counts(self.work / stage.junit)
        record["counts"] = stage_counts(record, junit)
        self.summary["verdict"] = self.verdict() if self.summary.get("finished") else "incomplete"
        self.write()
        return record

    def write(self):
        """summary.json and bundle.tar.gz, each replaced whole: a kill leaves the last ones."""
        self.summary["seconds"] = self.elapsed()
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1))
        tmp.replace(self.out / "summary.json")
        tmp, cap = self.out / "bundle.tar.gz.tmp", MAX_DEBUG_BYTES
        while True:  # too big: the NCCL logs are cut shorter
            self.bundle(tmp, cap)
            if tmp.stat().st_size <= MAX_BUNDLE_BYTES or cap < 1024:
                break
            cap //= 4
        tmp.replace(self.out / "bundle.tar.gz")
        if self.on_summary:
            self.on_summary(json.loads((self.out / "summary.json").read_text()))

    def bundle(self, path, cap):
        """Every work file into a tar.gz; of one over `cap` bytes (a huge NCCL log) its head."""
        with tarfile.open(path, "w:gz") as tar:
            for file in sorted(f for f in self.work.iterdir() if f.is_file()):
                if file.stat().st_size <= cap:
                    tar.add(file, arcname=file.name)
                    continue
                with open(file, "rb") as src:
                    data = src.read(cap)
                head = tarfile.TarInfo(file.name + ".head")
                head.size, head.mtime = len(data), int(file.stat().st_mtime)
                tar.addfile(head, io.BytesIO(data))

    def run(self):
        env = self.environment()
        self.summary["cuda_home"] = env["CUDA_HOME"]
        self.summary["mps"] = ("not started yet (after the build)" if self.want_mps else
                               "off (the default; --mps tries it)")
        self.tools = {"compute-sanitizer": find_tool("compute-sanitizer", env["CUDA_HOME"])}
        self.summary["tools"] = self.tools
        self.say(f"== gpu_check: python {self.python}, CUDA_HOME {env['CUDA_HOME']}, "
                 f"MPS {self.summary['mps']}, dry run {self.dry}")
        try:
            timeout = self.dry or has_module(self.python, "pytest_timeout", env)
            if not timeout:
                self.say("== pytest-timeout is not installed: the stage limit bounds the tests")
            self.stages = plan(self.python, self.work, pytest_timeout=timeout, tools=self.tools)
            self.check_plan()
            self.summary["tests_planned"] = planned_tests(self.stages)
            build_failed, results = False, self.summary["results"]
            for stage in self.stages:
                if build_failed:  # nothing to test: every later stage would only skip
                    self.finish(stage, {"name": stage.name, "limit_s": stage.limit,
                                        "start_s": self.elapsed(), "rc": None,
                                        "skipped": "build failed"})
                    continue
                record = self.run_stage(stage, env)
                if stage.name in ("env", "info"):
                    found = {**results.get("env", {}), **results.get("info", {})}
                    self.summary["multi_rank_path"] = found.get("multi_rank_path", "unknown")
                    self.summary["plan"]["machine_differences"] = differences(
                        gpu_machine.MACHINE, found, self.tools)
                if stage.name == "build" and record.get("rc") != 0:
                    build_failed = True
                    self.say("== build failed: the later stages are not run")
                if stage.name == "info" and self.want_mps:  # its probe needs the build
                    self.summary["mps"] = self.mps.start(env)
                    self.say(f"== MPS: {self.summary['mps']}")
        finally:
            self.mps.stop()
            self.summary["finished"] = True
            self.summary["verdict"] = self.verdict()
            self.write()
            self.log.close()
            shutil.rmtree(self.work, ignore_errors=True)
        return self.summary

    def check_plan(self):
        """The plan's arithmetic and its fit to the machine (gpu_check_plan.problems): a dry run
        fails on any problem; a real run records them (its stages show the rest)."""
        found, machine = problems(self.stages), gpu_machine.MACHINE
        if len(OUTPUT_FILES) > machine["output_files_max"]:
            found.append(f"{len(OUTPUT_FILES)} output files, the machine returns "
                         f"{machine['output_files_max']}")
        self.summary["plan"] = {"table": table(self.stages), "problems": found,
                                "machine": machine, "machine_differences": []}
        width = max(len(s.name) for s in self.stages)
        for row in self.summary["plan"]["table"]:
            self.say(f"== plan: {row['stage']:<{width}} launches {row['launches']}  limit "
                     f"{row['limit_s']:>5g} s = {row['from']}"
                     + ("  (optional)" if row["optional"] else ""))
        for problem in found:
            self.say(f"== plan problem: {problem}")

    def verdict(self):
        if self.dry and self.summary.get("plan", {}).get("problems"):
            return "fail"
        return verdict(self.stages, self.summary["stages"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "gpu_check_out")),
                        help="folder for summary.json, check.log and bundle.tar.gz")
    parser.add_argument("--dry-run", action="store_true",
                        default=os.environ.get("RINGCOMM_GPU_CHECK_DRY", "") not in ("", "0"),
                        help="stub the stages that need a GPU; fail if the plan does not fit")
    parser.add_argument("--fail-stage", metavar="STAGE",
                        help="with --dry-run: make this stage fail (its first test)")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="SECONDS",
                        help="how long all stages may take together")
    parser.add_argument("--mps", action="store_true",
                        default=os.environ.get("RINGCOMM_GPU_CHECK_MPS") == "1",
                        help="run the stages after the build under MPS, if an all_reduce works")
    parser.add_argument("--probe", choices=("env", "info"),
                        help="only write what the machine has (env) or the built ringcomm sees "
                             "(info) to OUT/env.json or OUT/info.json")
    args = parser.parse_args()
    if args.probe:
        found = json.dumps({"env": env_probe, "info": info_probe}[args.probe](), indent=1)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.probe}.json").write_text(found)
        print(found)
        return
    if args.fail_stage and not args.dry_run:
        parser.error("--fail-stage only simulates a failure in a dry run (--dry-run)")
    summary = Check(args.out, python_with_torch(), args.dry_run, args.time_limit,
                    fail_stage=args.fail_stage, mps=args.mps).run()
    codes = {s["name"]: s.get("rc") for s in summary["stages"]}
    print(f"verdict: {summary['verdict']};", json.dumps(codes), summary["seconds"], "s; files:",
          sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
