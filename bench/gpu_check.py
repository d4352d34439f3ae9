"""The GPU check: is this GPU machine healthy for ringcomm?

One bounded run on a single-GPU machine: it builds ringcomm in place, runs its GPU tests and
benchmarks, and writes a verdict with everything needed to read it.

Stages run in order under one global deadline (default 345 s, so the whole check with its
kill-after slack and the final bundling stays under 6 minutes), correctness first: the plan, its
limits (from the cost of a launch of ranks and of each test) and the verdict rules are
bench/gpu_check_plan.py; bench/gpu_check_fit.py checks that plan against the GPU machine it is
written for; this file runs it. A stage that fails is recorded and the next one still runs,
except after a failed build (nothing left to test); a stage past its limit is interrupted
(SIGINT: pytest still reports what ran), then killed KILL_AFTER seconds later. A test stage's
launch of ranks is told the stage's deadline, so its tests report before the stage is cut.

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

The programs the env and info stages run are in gpu_check_probes.py, a dry run's stand-ins in
gpu_check_dry.py, MPS in gpu_check_mps.py, and summary.json and bundle.tar.gz are written by
gpu_check_report.py.

Only the standard library here: the probes that need torch or ringcomm run as stages.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_fit  # noqa: E402
import gpu_check_mps  # noqa: E402
import gpu_check_report  # noqa: E402
from gpu_check_dry import dry_stub  # noqa: E402
from gpu_check_plan import (BUDGET, REPORT_S, plan, planned_tests, stage_counts,  # noqa: E402
                            table, verdict)
from gpu_check_probes import PROBES  # noqa: E402
from gpu_check_report import junit_counts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KILL_AFTER = 5
# Build-time Python packages a machine without network may lack (pybind11 is no dependency of
# torch): copied here by hand (an ignored folder), on every stage's path when present.
PYDEPS = ROOT / "build" / "pydeps"
# check.log: stage output past this is left out (the check's own "==" lines stay)
MAX_LOG_BYTES = 12 << 20

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


class Check:
    """One run of the check: the plan's stages in order under one deadline, each recorded in the
    summary as it ends."""

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
        self.mps = gpu_check_mps.Mps(python, self.work, ROOT, dry, self.say)
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
        """summary.json and bundle.tar.gz, rewritten (gpu_check_report.write)."""
        self.summary["seconds"] = self.elapsed()
        gpu_check_report.write(self.out, self.work, self.summary)
        if self.on_summary:
            self.on_summary(json.loads((self.out / "summary.json").read_text()))

    def run(self):
        env = self.environment()
        self.summary["cuda_home"] = env["CUDA_HOME"]
        self.summary["mps"] = ("not started yet (after the build)" if gpu_check_mps.wanted() else
                               "off (the default; RINGCOMM_GPU_CHECK_MPS=1 tries it)")
        self.tools = {"compute-sanitizer": find_tool("compute-sanitizer", env["CUDA_HOME"])}
        self.summary["tools"] = self.tools
        self.say(f"== gpu_check: python {self.python}, CUDA_HOME {env['CUDA_HOME']}, "
                 f"MPS {self.summary['mps']}, dry run {self.dry}")
        try:
            self.stages = plan(self.python, self.work, PROBES,
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
                if stage.name == "info" and gpu_check_mps.wanted():
                    # After the build: the probe's ranks use ringcomm's shared_gpu_env.
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
