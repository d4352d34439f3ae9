"""tools/gpu_check.py: its stage logic, run here in dry-run mode (no GPU needed). The machine
it is planned for returns a bounded number of output files, and a run cut short must still
report: so few files, and summary.json rewritten after every stage; stages past their limit are
killed, optional stages run only while time is left; tests run by value, and one verdict says
what the run showed. The plan's limits follow from the cost of a launch of ranks, every
multi-rank stage makes one, and the dry run checks the plan against the GPU machine."""
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import gpu_check  # noqa: E402
import gpu_check_plan  # noqa: E402
import gpu_machine  # noqa: E402
import pytest  # noqa: E402
from gpu_check_plan import LAUNCH_S, PYTEST_S, REPORT_S, TESTS, Stage  # noqa: E402

pytestmark = pytest.mark.system  # runs the GPU check: a program that runs pytest stages

CHECK = str(ROOT / "tools" / "gpu_check.py")


def test_dry_run_through_the_script_bounds_the_output(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "RINGCOMM_GPU_CHECK_DRY": "1"}
    proc = subprocess.run([sys.executable, CHECK], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p.name for p in out.rglob("*"))
    assert files == sorted(gpu_check.OUTPUT_FILES)
    assert len(files) <= gpu_machine.MACHINE["output_files_max"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["finished"]
    names = [s["name"] for s in summary["stages"]]
    assert names[:4] == ["env", "build", "info", "tests_correct"], "correctness first"
    assert names.index("allreduce2") < names.index("tests_p2p_one_hop") < names.index("kernels")
    assert names.index("kernels") < names.index("allreduce4") < names.index("tests4")
    assert names[-1] == "sanitizer", "compute-sanitizer last: optional, and slow"
    assert all(s["rc"] == 0 for s in summary["stages"]), summary["stages"]
    assert summary["verdict"] == "pass"
    assert summary["plan"]["problems"] == []
    assert [row["stage"] for row in summary["plan"]["table"]] == names
    planned = summary["tests_planned"]
    assert planned[0].endswith("test_world2_every_collective_dtype_op_exact_in_one_launch")
    assert planned.index("bench:allreduce2") < planned.index("bench:kernels")
    # The environment stage really ran: it names the interpreters and the NCCL it loaded.
    env_found = summary["results"]["env"]
    assert {"python", "python3", "nvcc"} <= env_found["which"].keys()
    assert summary["multi_rank_path"] == summary["results"]["info"].get("multi_rank_path",
                                                                        "unknown")
    assert summary["mps"].startswith("off (the default"), "MPS only when asked"
    correct = next(s for s in summary["stages"] if s["name"] == "tests_correct")
    assert correct["counts"] == {"ran": 3, "passed": 3, "failed": 0, "skipped": 0,
                                 "cut_short": 0}
    with tarfile.open(out / "bundle.tar.gz") as bundle:
        assert {"kernels.json", "allreduce2.json", "tests_correct.xml"} <= set(bundle.getnames())
    assert "== tests_correct" in (out / "check.log").read_text()


def test_mandatory_limits_fit_the_budget_and_every_gpu_test_is_planned(tmp_path):
    stages = gpu_check_plan.plan(sys.executable, tmp_path)
    assert sum(s.limit for s in stages if not s.optional) <= gpu_check_plan.MANDATORY_LIMIT
    source = (ROOT / "tests" / "test_gpu.py").read_text()
    planned = {test.split("::")[1].split("[")[0] for s in stages for test in s.tests}
    defined = {line.split("(")[0][4:] for line in source.splitlines()
               if line.startswith("def test_")}
    assert planned <= defined, planned - defined  # no node id that pytest would not find
    assert gpu_check_plan.problems(stages) == []


def test_each_multi_rank_stage_makes_one_launch_and_its_limit_holds_it(tmp_path):
    """A launch of ranks costs LAUNCH_S whatever it runs: a stage's multi-rank tests share one,
    and its limit holds pytest's start, that launch, every test's cost and the report; the
    launch's own budget leaves pytest time to start and report inside the limit."""
    stages = {s.name: s for s in gpu_check_plan.plan(sys.executable, tmp_path)}
    for name, tests in TESTS.items():
        stage = stages[name]
        multi_rank = [t for t in tests if t.ranks]
        assert multi_rank and stage.launches == 1, name
        assert stage.limit >= (PYTEST_S + stage.launches * LAUNCH_S
                               + sum(t.seconds for t in tests) + REPORT_S), name
        launch_budget = float(stage.env["RINGCOMM_TEST_LAUNCH_TIMEOUT"])
        assert launch_budget >= LAUNCH_S + sum(t.seconds for t in multi_rank), name
        assert launch_budget <= stage.limit - PYTEST_S - REPORT_S, name
    for name in ("allreduce2", "allreduce4"):  # a benchmark's own launch
        assert stages[name].launches == 1 and stages[name].limit >= LAUNCH_S + stages[name].work_s
    mandatory = [s for s in stages.values() if not s.optional]
    assert sum(s.limit for s in mandatory) <= gpu_check_plan.MANDATORY_LIMIT
    assert gpu_check_plan.MANDATORY_LIMIT <= 0.8 * gpu_check_plan.TIME_LIMIT  # room for misestimates


def test_the_fit_check_finds_what_does_not_fit(tmp_path):
    """The dry run's check against the GPU machine: a missing package (numpy, which the tests
    and ringcomm import), a build that would need a registry, limits below their launches, a
    multi-rank test planned as single-process, a tool the machine lacks."""
    stages = gpu_check_plan.plan(sys.executable, tmp_path)
    machine = {**gpu_machine.MACHINE, "tools": ["nvcc"],
               "modules": [m for m in gpu_machine.MACHINE["modules"] if m != "numpy"]}
    by_name = {s.name: s for s in stages}
    by_name["build"].argv = [sys.executable, "-m", "pip", "install", "."]
    by_name["tests_correct"].limit = 30
    found = gpu_check_plan.problems(stages, machine)
    assert any("tests/support/collective_checks.py imports numpy" in p for p in found), found
    assert any(p.startswith("build: ") and "registry" in p for p in found), found
    assert any(p.startswith("tests_correct: limit 30") for p in found), found
    assert any("sanitizer: needs compute-sanitizer" in p for p in found), found
    by_name["build"].argv = [sys.executable, "-m", "pip", "install", "--no-build-isolation",
                             "--no-deps", "."]
    assert not any(p.startswith("build: ") for p in gpu_check_plan.problems(stages))


def test_the_plan_counts_tests_as_test_gpu_runs_them(monkeypatch, tmp_path):
    wrong = dict(TESTS)
    wrong["tests_failures"] = [gpu_check_plan.Test("test_timeout_names_peers", 10, 0)]
    monkeypatch.setattr(gpu_check_plan, "TESTS", wrong)
    stages = gpu_check_plan.plan(sys.executable, tmp_path)
    assert gpu_check_plan.planned_tests_match(stages, ROOT) == [
        "tests_failures: the plan runs test_timeout_names_peers on no ranks, tests/test_gpu.py "
        "on 2"]


def test_a_plan_that_does_not_fit_fails_the_dry_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_machine, "MACHINE", {**gpu_machine.MACHINE, "modules": []})
    summary = gpu_check.Check(tmp_path / "out", sys.executable, dry=True).run()
    assert summary["verdict"] == "fail"
    assert any("imports torch" in p for p in summary["plan"]["problems"])
    assert "plan problem" in (tmp_path / "out" / "check.log").read_text()


def _dry(tmp_path, *args):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, CHECK, "--dry-run", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "summary.json").read_text())


def test_a_failed_build_fails_the_check_and_stops_it(tmp_path):
    summary = _dry(tmp_path, "--fail-stage", "build")
    assert summary["verdict"] == "fail"
    skipped = [s["name"] for s in summary["stages"] if s.get("skipped") == "build failed"]
    assert skipped and skipped[0] == "info"


def test_a_failing_test_stage_fails_the_check(tmp_path):
    summary = _dry(tmp_path, "--fail-stage", "tests_failures")
    assert summary["verdict"] == "fail"
    stage = next(s for s in summary["stages"] if s["name"] == "tests_failures")
    assert stage["counts"]["failed"] == 1 and stage["counts"]["ran"] == 3


def test_verdict_rules():
    stages = [Stage("build", 10, []), Stage("t", 10, [], tests=["a", "b"]),
              Stage("opt", 10, [], tests=["c"], optional=True)]

    def record(name, **fields):
        counts = {"ran": 1, "passed": 1, "failed": 0, "skipped": 0}
        counts.update(fields.pop("counts", {}))
        return {"name": name, "rc": 0, "counts": counts, **fields}

    ok = [record("build"), record("t", counts={"ran": 2, "passed": 2})]
    assert gpu_check_plan.verdict(stages, ok) == "pass"  # an optional stage may be left out
    every_test_skipped = [record("build"), record("t", counts={"ran": 0, "passed": 0,
                                                               "skipped": 2})]
    assert gpu_check_plan.verdict(stages, every_test_skipped) == "fail"
    cut = [record("build"), record("t", timed_out=True, counts={"ran": 1})]
    assert gpu_check_plan.verdict(stages, cut) == "incomplete"
    not_reached = [record("build"), {"name": "t", "rc": None, "skipped": "not enough time"}]
    assert gpu_check_plan.verdict(stages, not_reached) == "incomplete"
    failed = ok + [record("opt", counts={"failed": 1, "passed": 0})]
    assert gpu_check_plan.verdict(stages, failed) == "fail"
    # Tests skipped because their shared launch ran out of time: cut short, not passed.
    launch_cut = [record("build"), record("t", counts={"ran": 1, "skipped": 1, "cut_short": 1})]
    assert gpu_check_plan.verdict(stages, launch_cut) == "incomplete"
    opt_cut = ok + [record("opt", counts={"cut_short": 1})]
    assert gpu_check_plan.verdict(stages, opt_cut) == "pass"


def test_junit_cut_short_and_an_exit_code_no_test_saw(tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="2">'
                   '<testcase classname="c" name="a" time="1.25"/>'
                   '<testcase classname="c" name="b"><skipped message="cut short: b was never '
                   'reached"/></testcase>'
                   '<testcase classname="c" name="x"><skipped message="no GPU"/></testcase>'
                   '</testsuite></testsuites>')
    counts = gpu_check.junit_counts(xml)
    assert counts["cut_short"] == ["c::b"]
    # Each test's seconds go to the summary: what a first GPU run measures for the plan.
    assert counts["seconds"] == {"c::a": 1.25, "c::b": 0.0, "c::x": 0.0}
    assert gpu_check_plan.stage_counts({"rc": 0}, counts) == {
        "ran": 1, "passed": 1, "failed": 0, "skipped": 2, "cut_short": 1}
    # compute-sanitizer's errors: every test passed, the stage exited 1.
    assert gpu_check_plan.stage_counts({"rc": 1}, counts)["failed"] == 1
    assert gpu_check_plan.stage_counts({"rc": 2, "timed_out": True}, counts)["failed"] == 0


def test_summary_is_rewritten_after_every_stage(tmp_path):
    snapshots = []

    def seen(summary):
        snapshots.append(summary)
        files = list((tmp_path / "out").iterdir())
        assert len(files) <= gpu_machine.MACHINE["output_files_max"]

    gpu_check.Check(tmp_path / "out", sys.executable, dry=True, on_summary=seen).run()
    stages = len(gpu_check_plan.plan(sys.executable, tmp_path))
    assert len(snapshots) == stages + 1  # once per stage, once at the end
    for k, summary in enumerate(snapshots[:-1]):
        assert len(summary["stages"]) == k + 1 and "finished" not in summary
    assert snapshots[-1]["finished"]


def test_stages_past_their_limit_are_killed_and_late_stages_skipped(tmp_path, monkeypatch):
    py = sys.executable
    stages = [
        Stage("hangs", 1, [py, "-c", "import time; print('started', flush=True); "
                                               "time.sleep(60)"], needs_gpu=False),
        Stage("ignores_int", 1, [py, "-c", "import signal, time; "
                                                     "signal.signal(signal.SIGINT, signal.SIG_IGN); "
                                                     "time.sleep(60)"], needs_gpu=False),
        Stage("fails", 5, [py, "-c", "raise SystemExit(3)"], needs_gpu=False),
        Stage("world4", 60, [py, "-c", "pass"], needs_gpu=False, optional=True),
    ]
    monkeypatch.setattr(gpu_check, "plan", lambda *args, **kwargs: stages)
    monkeypatch.setattr(gpu_check, "KILL_AFTER", 1)
    summary = gpu_check.Check(tmp_path / "out", py, dry=True, time_limit=30).run()
    hangs, ignores, fails, world4 = summary["stages"]
    assert hangs["timed_out"] and hangs["rc"] != 0 and hangs["seconds"] < 10
    assert ignores["timed_out"] and ignores["rc"] == -9  # SIGKILL after the slack
    assert fails["rc"] == 3 and not fails["timed_out"], "a failing stage does not stop the run"
    assert world4["rc"] is None and "not enough time" in world4["skipped"]
    assert summary["seconds"] < 30
    assert "started" in (tmp_path / "out" / "check.log").read_text()


def test_cuda_home_comes_from_the_toolkit_not_a_wrapper(tmp_path, monkeypatch):
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime_api.h").write_text("")
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    links = tmp_path / "bin"
    links.mkdir()
    (links / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(links))
    assert gpu_check.cuda_home() == str(toolkit)
    (links / "nvcc").unlink()
    (links / "nvcc").write_text("#!/bin/sh\n")  # a wrapper script: no toolkit next to it
    (links / "nvcc").chmod(0o755)
    assert gpu_check.cuda_home() == "/usr/local/cuda"


def test_pytest_cut_short_still_reports_what_ran(tmp_path, monkeypatch):
    """A test stage past its limit is interrupted, not terminated: pytest then still writes its
    JUnit XML and summary, so the output says which tests passed and which failed."""
    tests = tmp_path / "test_cut.py"
    tests.write_text("import time\n"
                     "def test_passes():\n    pass\n"
                     "def test_fails():\n    assert False, 'reported'\n"
                     "def test_hangs():\n    time.sleep(120)\n")
    work = tmp_path / "work"
    work.mkdir()
    py = sys.executable
    stage = Stage("tests", 15, [py, "-m", "pytest", str(tests), "-v", "-rA", "-p",
                                          "no:cacheprovider", f"--junitxml={work / 't.xml'}"],
                            junit="t.xml", needs_gpu=False)
    monkeypatch.setattr(gpu_check, "plan", lambda *args, **kwargs: [stage])
    check = gpu_check.Check(tmp_path / "out", py, dry=True, time_limit=60)
    check.work = work  # where the stage writes its XML
    summary = check.run()
    (record,) = summary["stages"]
    assert record["timed_out"]
    counts = summary["results"]["tests"]
    assert counts["failures"] == 1 and counts["failed"][0].endswith("test_fails"), counts
    assert counts["tests"] >= 2, counts
    log = (tmp_path / "out" / "check.log").read_text()
    assert "test_passes PASSED" in log and "reported" in log


def test_script_picks_the_interpreter_that_has_torch(tmp_path):
    """An image may have a bare `python` next to the python3 that holds torch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\nexit 1\n")  # no torch here
    (bin_dir / "python").chmod(0o755)
    # A script, not a symlink: a symlink to a virtual environment's interpreter, found outside
    # that environment's bin/, does not see the environment's packages.
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "RINGCOMM_GPU_CHECK_DRY": "1",
           "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    # Started by a Python without torch (-S: no site-packages); its stages run under python3.
    proc = subprocess.run([sys.executable, "-S", CHECK], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"]["env"]["which"]["python3"] == str(bin_dir / "python3")
    assert summary["results"]["env"]["torch"], "ran under the interpreter that has torch"


def test_mps_that_cannot_serve_is_stopped_and_left_out(tmp_path, monkeypatch):
    """A control daemon that starts but under which two ranks cannot run an NCCL all_reduce
    (here: no GPU at all) would fail every later stage: the check stops it and runs without."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    control = bin_dir / "nvidia-cuda-mps-control"
    # `-d` starts the daemon; no argument reads commands ("quit") from stdin.
    control.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                       f"[ $# -eq 0 ] && cat >> {calls}\nexit 0\n")
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    check = gpu_check.Check(tmp_path / "out", sys.executable, dry=False)
    env = {"PATH": os.environ["PATH"]}
    state = check.mps.start(env)
    assert state.startswith("started but unusable"), state
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env and "CUDA_MPS_LOG_DIRECTORY" not in env
    assert "quit" in calls.read_text(), "the daemon was told to quit"
    check.mps.stop()  # already stopped: nothing more is sent
    assert calls.read_text().count("quit") == 1


def test_carried_build_packages_are_on_the_stages_path(tmp_path, monkeypatch):
    """pybind11 is no dependency of torch: without network it is copied into build/pydeps, and
    every stage (the build first) finds it there."""
    deps = tmp_path / "pydeps"
    monkeypatch.setattr(gpu_check, "PYDEPS", deps)
    check = gpu_check.Check(tmp_path / "out", sys.executable, dry=True)
    assert str(deps) not in check.environment()["PYTHONPATH"].split(os.pathsep)
    deps.mkdir()
    path = check.environment()["PYTHONPATH"].split(os.pathsep)
    assert path[0] == str(gpu_check.ROOT) and str(deps) in path


def test_bundle_stays_under_the_output_file_limit(tmp_path, monkeypatch):
    """Huge NCCL logs: the bundle keeps their heads, cut shorter until it fits."""
    monkeypatch.setattr(gpu_check, "MAX_BUNDLE_BYTES", 256 << 10)
    check = gpu_check.Check(tmp_path / "out", sys.executable, dry=True)
    for k in range(4):  # incompressible: gzip cannot save the bundle
        (check.work / f"nccl.{k}.log").write_bytes(os.urandom(1 << 20))
    (check.work / "tests_correct.xml").write_text("<testsuites/>")
    check.write()
    assert (tmp_path / "out" / "bundle.tar.gz").stat().st_size <= 256 << 10
    with tarfile.open(tmp_path / "out" / "bundle.tar.gz") as bundle:
        names = set(bundle.getnames())
    assert {"nccl.0.log.head", "tests_correct.xml"} <= names


def test_a_missing_tool_skips_its_stage_and_test_stages_get_their_deadline(tmp_path,
                                                                           monkeypatch):
    py = sys.executable
    seen = tmp_path / "ends_at"
    stages = [Stage("sanitized", 5, [py, "-c", "raise SystemExit(9)"], needs_gpu=False,
                    optional=True, tool="compute-sanitizer"),
              Stage("tests", 20, [py, "-c", f"import os; open({str(seen)!r}, 'w').write("
                                            "os.environ['RINGCOMM_TEST_ENDS_AT'])"],
                    junit="none.xml", needs_gpu=False)]
    monkeypatch.setattr(gpu_check, "plan", lambda *args, **kwargs: stages)
    monkeypatch.setattr(gpu_check, "find_tool", lambda name, home: None)
    monkeypatch.setattr(gpu_check.Check, "check_plan", lambda self: self.summary.update(
        plan={"problems": [], "machine_differences": []}))
    start = time.time()
    summary = gpu_check.Check(tmp_path / "out", py, dry=False, time_limit=60).run()
    sanitized, tests = summary["stages"]
    assert sanitized["skipped"] == "compute-sanitizer not found" and sanitized["rc"] is None
    ends_at = float(seen.read_text())
    assert start + 20 - REPORT_S - 2 <= ends_at <= time.time() + 20 - REPORT_S


def test_docs_table_is_the_plan(tmp_path):
    """docs/benchmarks.md shows the plan's launches and limits: they must be the plan's."""
    stages = {s.name: s for s in gpu_check_plan.plan(sys.executable, tmp_path)}
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    table = text[text.index("| stage | launches | limit (s) |"):].split("\n\n")[0]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    shown = {}
    for names, launches, limits in rows:
        for name, limit in zip(names.split(","), limits.split(",")):
            shown[name.strip()] = (int(launches), float(limit))
    planned = {name: (s.launches, s.limit) for name, s in stages.items()}
    assert shown == planned
