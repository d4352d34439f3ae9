"""What the GPU check runs, in order, with each stage's time limit; how the stages' outcomes make
one verdict; and whether the plan adds up and fits the machine it is for (gpu_machine.py).

Order: correctness first (every collective x dtype x op exact at world 2, the DDP hook against
stock DDP, the torch backend on CUDA), then failure handling (CUDA graphs, a dead peer or a
skipped collective timing out), then speed (ringcomm against ncclAllReduce at 64 and 256 MiB),
and only with time left point-to-point and the one-hop algorithms, the kernels' bandwidth, the
remaining GPU tests, world 4 and the kernels under compute-sanitizer.

Limits come from costs: starting the ranks costs LAUNCH_S whatever they run, so each multi-rank
stage runs its tests in ONE launch (tests/support/shared_launch.py), and its limit is pytest's start +
its launches x LAUNCH_S + its tests' costs + the report. The per-test costs are estimates; each
test stage's launches.jsonl in the bundle records what every launch and check took. Mandatory
stages fit the time limit together; optional ones run only when their whole limit still fits.

Only the standard library: the check starts where torch may be missing.
"""
import ast
import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import gpu_machine

ROOT = Path(__file__).resolve().parent.parent
FINISH_S = 15  # after the stages: the last one's kill slack and the final bundle
TIME_LIMIT = gpu_machine.MACHINE["check_minutes"] * 60 - FINISH_S  # seconds for all stages
# The per-test costs are estimates until a GPU run measures them (the summary records each
# test's seconds): mandatory stages leave this share of the time limit free.
SLACK = 0.2
MANDATORY_LIMIT = TIME_LIMIT * (1 - SLACK)
TEST_TIMEOUT = 30  # pytest-timeout per test run in pytest's own process
GPU_TESTS = "tests/test_gpu.py"
CHECK = "tools/gpu_check.py"  # also runs the env and info stages' probes

# Seconds one launch of the ranks costs before its first check: an interpreter per rank,
# importing torch, a CUDA context each, the gloo group and NCCL's first communicator.
LAUNCH_S = 15
PYTEST_S = 5   # pytest's own start: importing torch, collecting tests/test_gpu.py
REPORT_S = 5   # after the last test: the ranks' exit, the JUnit XML


@dataclass(frozen=True)
class Test:
    """A test function of tests/test_gpu.py (each of its parameters the stage's worlds allow)."""
    name: str
    seconds: float   # its cost on the GPU, its launch excluded (an estimate)
    ranks: int = 0   # 0: runs in pytest's own process; N: a check in the stage's launch of N ranks


# Per test stage, in run order; a stage's multi-rank tests share one launch per world size.
TESTS = {
    "tests_correct": [Test("test_world2_every_collective_dtype_op_exact_in_one_launch", 40, 2),
                      Test("test_ddp_hook_on_cuda_matches_stock_ddp", 10, 2),
                      Test("test_torch_backend_on_cuda", 5, 2)],
    # The dead-peer check last: it aborts a ring on purpose.
    "tests_failures": [Test("test_stream_semantics_and_graphs", 15, 2),
                       Test("test_timeout_names_peers", 10, 2),
                       Test("test_missing_peer_times_out_at_creation", 10)],
    "tests_p2p_one_hop": [Test("test_point_to_point_and_all_to_all", 10, 2),
                          Test("test_python_point_to_point_on_cuda", 10, 2),
                          Test("test_publication_rounds", 5, 2),
                          Test("test_one_hop_all_reduce_exact", 20, 2)],
    "tests_rest": [Test("test_python_api_on_cuda_tensors", 5, 2),
                   Test("test_every_collective", 20, 2),
                   Test("test_wire_all_reduce", 15, 2),
                   Test("test_nccl_loads_and_makes_ids", 2),
                   Test("test_reduce_kernel_exact", 25),
                   Test("test_wire_reduce_kernel_matches_cpu", 10),
                   Test("test_a_cuda_work_waits_on_the_gpu_not_the_host", 5)],
    "tests4": [Test("test_every_collective", 30, 4), Test("test_wire_all_reduce", 25, 4)],
}

# A few kernel tests under compute-sanitizer's memcheck, each tensor its own cudaMalloc (no
# caching allocator), so an access past a tensor's end is past an allocation. Few: under
# memcheck every kernel, torch's included, runs far slower.
SANITIZED = [Test("test_reduce_kernel_exact[float32-sum]", 10),
             Test("test_reduce_kernel_exact[bfloat16-avg]", 10),
             Test("test_reduce_kernel_exact[int8-max]", 10),
             Test("test_reduce_kernel_in_place", 5),
             Test("test_wire_reduce_kernel_in_place", 5),
             Test("test_convert_kernel", 10),
             Test("test_copy_kernel", 2)]
SANITIZER_START_S = 15  # pytest and torch's CUDA start-up under the sanitizer


def launches(tests):
    """Launches of ranks a stage makes: one per world size among its multi-rank tests."""
    return len({t.ranks for t in tests if t.ranks})


def launch_seconds(tests):
    """The longest of a stage's launches: LAUNCH_S + its checks (each launch's own limit)."""
    return max((LAUNCH_S + sum(t.seconds for t in tests if t.ranks == world)
                for world in {t.ranks for t in tests if t.ranks}), default=0)


def test_stage_seconds(tests, start_s=PYTEST_S):
    return start_s + launches(tests) * LAUNCH_S + sum(t.seconds for t in tests) + REPORT_S


@dataclass
class Stage:
    name: str
    limit: float                 # seconds at most
    argv: list
    env: dict = field(default_factory=dict)
    result: str = None           # JSON file the stage writes (folded into the summary)
    junit: str = None            # JUnit XML the stage writes (test counts go to the summary)
    tests: list = field(default_factory=list)  # the pytest node ids it runs
    optional: bool = False       # runs only when its whole limit still fits
    needs_gpu: bool = True       # False: runs for real in a dry run too (the environment probe)
    launches: int = 0            # launches of ranks it makes (each costs LAUNCH_S)
    work_s: float = None         # what its limit must hold besides its launches (None: no rule)
    tool: str = None             # a program it needs (a key of plan's tools): skipped without


def plan(python, work, pytest_timeout=True, tools=None):
    """The stages, in order. `work` holds everything that goes into the bundle; `tools` the paths
    of programs optional stages need (compute-sanitizer), None where absent."""
    py, work, tools = [python], Path(work), tools or {}

    def pytest_argv(name, nodes):
        argv = ["-m", "pytest", *nodes, "-v", "-rA", "-p", "no:cacheprovider",
                f"--junitxml={work / (name + '.xml')}"]
        return argv + ([f"--timeout={TEST_TIMEOUT}"] if pytest_timeout else [])

    def tests(name):
        found = TESTS[name]
        nodes = [f"{GPU_TESTS}::{t.name}" for t in found]
        worlds = ",".join(str(w) for w in sorted({t.ranks for t in found if t.ranks})) or "2"
        env = {"RINGCOMM_TEST_WORLDS": worlds,
               "RINGCOMM_TEST_LAUNCH_TIMEOUT": str(launch_seconds(found)),
               "RINGCOMM_TEST_LAUNCH_LOG": str(work / f"{name}.launches.jsonl")}
        return dict(limit=test_stage_seconds(found), argv=py + pytest_argv(name, nodes), env=env,
                    junit=name + ".xml", tests=nodes, launches=launches(found),
                    work_s=test_stage_seconds(found) - launches(found) * LAUNCH_S)

    def allreduce(world, work_s):
        # 64 and 256 MiB over loopback sockets, NCCL's and 3 slice sizes: ~13 calls each.
        argv = py + ["bench/gpu_allreduce.py", "--world", str(world), "--mib", "64", "256",
                     "--slices-mib", "4", "16", "32",
                     "--json", str(work / f"allreduce{world}.json")]
        return dict(limit=LAUNCH_S + work_s, argv=argv, result=f"allreduce{world}.json",
                    launches=1, work_s=work_s)

    sanitized = [f"{GPU_TESTS}::{t.name}" for t in SANITIZED]
    sanitize_s = test_stage_seconds(SANITIZED, start_s=SANITIZER_START_S)
    return [
        Stage("env", 15, py + [CHECK, "--probe", "env", "--out", str(work)], result="env.json",
              needs_gpu=False),
        Stage("build", 75, py + ["setup.py", "build_ext", "--inplace"]),
        Stage("info", 10, py + [CHECK, "--probe", "info", "--out", str(work)], result="info.json"),
        Stage("tests_correct", **tests("tests_correct")),
        Stage("tests_failures", **tests("tests_failures")),
        Stage("allreduce2", **allreduce(2, 20)),
        Stage("tests_p2p_one_hop", **tests("tests_p2p_one_hop"), optional=True),
        Stage("kernels", 20, py + ["bench/gpu_kernels.py", "--mib", "256", "--json",
                                   str(work / "kernels.json")], result="kernels.json",
              optional=True),
        Stage("tests_rest", **tests("tests_rest"), optional=True),
        Stage("allreduce4", **allreduce(4, 25), optional=True),
        Stage("tests4", **tests("tests4"), optional=True),
        Stage("sanitizer", sanitize_s,
              [tools.get("compute-sanitizer") or "compute-sanitizer", "--tool", "memcheck",
               "--error-exitcode", "1", "--report-api-errors", "no", "--print-limit", "20"]
              + py + pytest_argv("sanitizer", sanitized),
              env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, junit="sanitizer.xml",
              tests=sanitized, optional=True, work_s=sanitize_s, tool="compute-sanitizer"),
    ]


def dry_stub(stage, work, python, failing=False):
    """A GPU stage in a dry run: it says what it would run and writes stand-in results (a JUnit
    file of its tests, all passed or the first failed), so limits, summary, verdict and bundle
    are exercised without a GPU."""
    cases = "".join(f'<testcase classname="dry" name="{test}">'
                    + ('<failure message="simulated"/>' if failing and i == 0 else "")
                    + "</testcase>" for i, test in enumerate(stage.tests))
    junit = (f'<testsuites><testsuite tests="{len(stage.tests)}" failures="{int(failing)}" '
             f'errors="0" skipped="0">{cases}</testsuite></testsuites>')
    stand_in = json.dumps({"dry_run": True})
    lines = [f"print('dry run: would run', {' '.join(stage.argv[:6])!r})"]
    if stage.result:
        lines.append(f"open({str(work / stage.result)!r}, 'w').write({stand_in!r})")
    if stage.junit:
        lines.append(f"open({str(work / stage.junit)!r}, 'w').write({junit!r})")
    if failing:
        lines.append("raise SystemExit('dry run: simulated failure')")
    return [python, "-c", "\n".join(lines)]


def planned_tests(stages):
    """Every test id in run order: pytest node ids, and a bench stage as 'bench:<name>'."""
    ids = []
    for stage in stages:
        if stage.tests:
            ids += [f"{stage.name}:{test}" for test in stage.tests]
        elif stage.name not in ("env", "build", "info"):
            ids.append(f"bench:{stage.name}")
    return ids


def table(stages):
    """The plan's arithmetic, one row per stage, for the summary and the log."""
    return [{"stage": s.name, "launches": s.launches, "limit_s": s.limit,
             "from": (f"{s.launches} x {LAUNCH_S} + {s.work_s:g}" if s.work_s is not None
                      else "fixed"), "optional": s.optional} for s in stages]


def junit_counts(path):
    """{tests, failures, errors, skipped, failed: [names], cut_short: [names], seconds: {name:
    seconds}} of a JUnit file (the seconds: what a first run measures, for the plan's costs)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        return {"unreadable": str(error)}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    cases = list(root.iter("testcase"))
    counts["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in cases
                        if c.find("failure") is not None or c.find("error") is not None]
    # Skipped because their shared launch ran out of time (tests/support/shared_launch.py): not passed.
    counts["cut_short"] = [f"{c.get('classname')}::{c.get('name')}" for c in cases
                           for skip in c.findall("skipped")
                           if "cut short:" in (skip.get("message") or "")]
    counts["seconds"] = {f"{c.get('classname')}::{c.get('name')}": float(c.get("time", 0))
                         for c in cases}
    return counts


def stage_counts(record, junit):
    """{ran, passed, failed, skipped, cut_short} of one stage: its tests from the JUnit counts,
    else the stage itself as one (passed when it exited 0). A stage that exited non-zero on its
    own with every test passed counts one failure more (compute-sanitizer's errors, which no test
    sees). cut_short: tests skipped because their shared launch ran out of time."""
    if record.get("skipped"):
        return {"ran": 0, "passed": 0, "failed": 0, "skipped": 0, "cut_short": 0}
    if junit is not None and "tests" in junit:
        failed = junit["failures"] + junit["errors"]
        ran = junit["tests"] - junit["skipped"]
        counts = {"ran": ran, "passed": ran - failed, "failed": failed,
                  "skipped": junit["skipped"], "cut_short": len(junit.get("cut_short", []))}
        if failed == 0 and record.get("rc") not in (0, None) and not record.get("timed_out"):
            counts.update(ran=ran + 1, failed=1)
        return counts
    ok = record.get("rc") == 0 and not record.get("timed_out")
    return {"ran": 1, "passed": int(ok), "failed": int(not ok), "skipped": 0, "cut_short": 0}


def verdict(stages, records):
    """'fail' when anything failed, the build did, or a mandatory test stage ran no test;
    'incomplete' when a mandatory stage did not run or was cut short without a failure;
    else 'pass'."""
    by_name = {r["name"]: r for r in records}
    incomplete = False
    for stage in stages:
        record = by_name.get(stage.name)
        if record is None or record.get("skipped"):
            if stage.optional:
                continue
            if record is not None and record.get("skipped", "").startswith("build failed"):
                return "fail"
            incomplete = True
            continue
        counts = record["counts"]
        if counts["failed"]:
            return "fail"
        if stage.optional:
            continue
        if record.get("timed_out") or counts.get("cut_short"):
            incomplete = True
        elif stage.tests and counts["ran"] == 0:
            return "fail"  # every test skipped (no GPU, or no CUDA build): nothing was verified
    return "incomplete" if incomplete else "pass"


# -- does the plan add up? ----------------------------------------------------------------------

def problems(stages, machine=None, root=ROOT):
    """Every way the plan does not add up or fit the machine, as sentences (empty: it fits)."""
    machine = machine or gpu_machine.MACHINE
    return arithmetic(stages) + gpu_machine.fits(stages, machine, root) + planned_tests_match(
        stages, root)


def arithmetic(stages):
    found = []
    for stage in stages:
        work = stage.work_s
        if work is not None and stage.limit + 1e-9 < stage.launches * LAUNCH_S + work:
            found.append(f"{stage.name}: limit {stage.limit} s < {stage.launches} launches x "
                         f"{LAUNCH_S} s + {stage.work_s} s of work")
        launch = stage.env.get("RINGCOMM_TEST_LAUNCH_TIMEOUT")
        if launch and float(launch) > stage.limit - PYTEST_S - REPORT_S:
            found.append(f"{stage.name}: its launch's {launch} s leave pytest no time to start "
                         f"and report within {stage.limit} s")
    mandatory = sum(s.limit for s in stages if not s.optional)
    if mandatory > MANDATORY_LIMIT:
        found.append(f"mandatory stages need {mandatory} s, over {MANDATORY_LIMIT:g} s (the time "
                     f"limit of {TIME_LIMIT} s less {SLACK:.0%} slack)")
    return found


def _shared_worlds(root):
    """{test function: how tests/test_gpu.py runs it}: None in pytest's own process, else the
    world its shares_launch mark names: a number, "first" (WORLDS[0]) or "param" (its `world`
    parameter, from RINGCOMM_TEST_WORLDS)."""
    found = {}
    for node in ast.parse((root / GPU_TESTS).read_text()).body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        found[node.name] = None
        for decorator in node.decorator_list:
            if getattr(getattr(decorator, "func", None), "id", "") == "shares_launch":
                world = next((k.value for k in decorator.keywords if k.arg == "world"), None)
                found[node.name] = (world.value if isinstance(world, ast.Constant) else
                                    "param" if world is None else "first")
    return found


def planned_tests_match(stages, root=ROOT):
    """Every planned test is one tests/test_gpu.py defines, planned as that file runs it: in
    pytest's process, or as a check in a launch of so many ranks (the limits follow from it)."""
    defined = _shared_worlds(root)
    planned = {**TESTS, "sanitizer": SANITIZED}
    found = []
    for stage in (s for s in stages if s.tests):
        worlds = [int(w) for w in stage.env.get("RINGCOMM_TEST_WORLDS", "2").split(",")]
        for test in planned.get(stage.name, []):
            name = test.name.split("[")[0]
            if name not in defined:
                found.append(f"{stage.name}: {test.name} is not a test of {GPU_TESTS}")
                continue
            how = defined[name]
            ranks = {None: 0, "first": worlds[0], "param": worlds[0]}.get(how, how)
            if how == "param" and len(worlds) > 1:
                ranks = "several"
            if ranks != test.ranks:
                found.append(f"{stage.name}: the plan runs {name} on {test.ranks or 'no'} ranks, "
                             f"{GPU_TESTS} on {ranks or 'none (in pytest)'}")
    return found


