"""What the GPU check runs, in the order it is worth running, with each stage's time limit; and
how the stages' outcomes make one verdict. The runner is bench/gpu_check.py; what the plan is
checked against (its arithmetic, the GPU machine) is bench/gpu_check_fit.py.

Order: correctness first (every collective x dtype x op exact at world 2, the DDP hook against
stock DDP, the torch backend on CUDA), then failure handling (CUDA graphs, a dead peer or a
skipped collective timing out), then point-to-point and the one-hop algorithms, then speed
(ringcomm against ncclAllReduce at 64 and 256 MiB), and only with time left the kernels'
bandwidth, the remaining GPU tests, world 4 and the kernels under compute-sanitizer.

Limits come from costs, not guesses per stage: a launch of ranks costs LAUNCH_S whatever it runs,
so every multi-rank stage runs its tests in ONE launch (tests/shared_launch.py), and its limit is
pytest's start + its launches x LAUNCH_S + what its tests cost + the report. The per-test costs
below are estimates, not yet measured on a GPU: each test stage's launches.jsonl in the bundle
records every launch's start-up and every check's seconds, the measurements to set them from.
Mandatory stages' limits sum to at most the budget; optional ones run only when their whole limit
still fits.
Every ring the tests build waits at most RINGCOMM_TEST_RING_TIMEOUT (20 s), so a hang costs a
check about that, and a launch never outlives its own budget.
"""
from dataclasses import dataclass, field
from pathlib import Path

BUDGET = 345  # seconds for all stages; + the kill slack and bundling stays under 6 minutes
TEST_TIMEOUT = 30  # pytest-timeout per test run in pytest's own process
GPU_TESTS = "tests/test_gpu.py"

# Seconds one launch of the ranks costs before its first check: a fresh interpreter per rank,
# importing torch, a CUDA context each, the gloo group, and NCCL's first communicator, which
# with torch 2.11's NCCL 2.28 takes the NCCL_HOSTID + loopback-sockets path (ranks share the GPU).
LAUNCH_S = 15
PYTEST_S = 5   # pytest's own start: importing torch, collecting tests/test_gpu.py
REPORT_S = 5   # after the last test: the ranks' exit, the JUnit XML


@dataclass(frozen=True)
class Test:
    """A test function of tests/test_gpu.py (each of its parameters the stage's worlds allow)."""
    name: str
    seconds: float   # what it costs on the GPU, its launch excluded (an estimate, not yet measured)
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

# The kernels under compute-sanitizer's memcheck: each test in one process, every tensor its own
# cudaMalloc (no caching allocator), so an access past a tensor's end is past an allocation.
# A few cases of the exact sweep: under memcheck every kernel, torch's included, runs far slower.
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
    """The longest of a stage's launches: LAUNCH_S + its checks (each launch's own budget)."""
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
    marker: str = None           # or a line prefix whose JSON the stage prints
    junit: str = None            # JUnit XML the stage writes (test counts go to the summary)
    tests: list = field(default_factory=list)  # the pytest node ids it runs
    optional: bool = False       # runs only when its whole limit still fits
    needs_gpu: bool = True       # False: runs for real in a dry run too (the environment probe)
    launches: int = 0            # launches of ranks it makes (each costs LAUNCH_S)
    work_s: float = None         # what its limit must hold besides its launches (None: no rule)
    tool: str = None             # a program it needs (a key of plan's tools): skipped without


def plan(python, work, probes, pytest_timeout=True, tools=None):
    """The stages, in order. `work` holds everything that goes into the bundle; `probes` the
    scripts of the env and info stages; `tools` the paths of programs optional stages need
    (compute-sanitizer), None where absent."""
    py = [python]
    tools = tools or {}

    def pytest_argv(name, nodes):
        argv = ["-m", "pytest", *nodes, "-v", "-rA", "-p", "no:cacheprovider",
                f"--junitxml={Path(work) / (name + '.xml')}"]
        if pytest_timeout:
            argv.append(f"--timeout={TEST_TIMEOUT}")
        return argv

    def tests(name):
        found = TESTS[name]
        nodes = [f"{GPU_TESTS}::{t.name}" for t in found]
        worlds = ",".join(str(w) for w in sorted({t.ranks for t in found if t.ranks})) or "2"
        env = {"RINGCOMM_TEST_WORLDS": worlds,
               "RINGCOMM_TEST_LAUNCH_TIMEOUT": str(launch_seconds(found)),
               "RINGCOMM_TEST_LAUNCH_LOG": str(Path(work) / f"{name}.launches.jsonl")}
        return dict(limit=test_stage_seconds(found), argv=py + pytest_argv(name, nodes), env=env,
                    junit=name + ".xml", tests=nodes, launches=launches(found),
                    work_s=test_stage_seconds(found) - launches(found) * LAUNCH_S)

    def allreduce(world, work_s):
        argv = py + ["bench/gpu_allreduce.py", "--world", str(world), "--mib", "64", "256",
                     "--slices-mib", "4", "16", "32", "--json",
                     str(Path(work) / f"allreduce{world}.json")]
        # 64 and 256 MiB over loopback sockets, NCCL's and 3 slice sizes: ~13 calls each.
        return dict(limit=LAUNCH_S + work_s, argv=argv, result=f"allreduce{world}.json",
                    launches=1, work_s=work_s)

    sanitized = [f"{GPU_TESTS}::{t.name}" for t in SANITIZED]
    sanitize_s = test_stage_seconds(SANITIZED, start_s=SANITIZER_START_S)
    return [
        Stage("env", 15, py + ["-c", probes["env"]], marker="ENV_JSON ", needs_gpu=False),
        Stage("build", 75, py + ["setup.py", "build_ext", "--inplace"]),
        Stage("info", 10, py + ["-c", probes["info"]], marker="INFO_JSON "),
        Stage("tests_correct", **tests("tests_correct")),
        Stage("tests_failures", **tests("tests_failures")),
        Stage("tests_p2p_one_hop", **tests("tests_p2p_one_hop")),
        Stage("allreduce2", **allreduce(2, 20)),
        Stage("kernels", 20, py + ["bench/gpu_kernels.py", "--mib", "256", "--json",
                                   str(Path(work) / "kernels.json")], result="kernels.json",
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
    """The plan's arithmetic, one row per stage, for the summary and the dry run."""
    return [{"stage": s.name, "launches": s.launches, "limit_s": s.limit,
             "from": (f"{s.launches} x {LAUNCH_S} + {s.work_s:g}" if s.work_s is not None
                      else "fixed"), "optional": s.optional} for s in stages]


def stage_counts(record, junit):
    """{ran, passed, failed, skipped, cut_short} of one stage: its tests from the JUnit counts,
    else the stage itself as one (passed when it exited 0). A stage that exited non-zero on its
    own (not cut short) with every test passed counts one failure more: e.g. compute-sanitizer's
    errors, which no test sees. cut_short: tests skipped because their shared launch ran out of
    time (tests/shared_launch.py), as a stage past its limit would have been."""
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
    'incomplete' when a mandatory stage did not run or was cut short (by its limit, or its
    launch's time) without a failure; else 'pass'."""
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
