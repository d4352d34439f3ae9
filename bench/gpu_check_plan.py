"""What the GPU check runs, in the order it is worth running, with each stage's time limit; and
how the stages' outcomes make one verdict. The runner is bench/gpu_check.py.

Order: correctness first (every collective x dtype x op exact at world 2 in one launch, the DDP
hook against stock DDP, the torch backend on CUDA), then failure handling (CUDA graphs, a dead
peer or a skipped collective timing out), then point-to-point and the one-hop algorithms, then
speed (ringcomm against ncclAllReduce at 64 and 256 MiB), and only with time left the kernels'
bandwidth, the remaining GPU tests and world 4. Mandatory stages' limits sum to the budget;
optional ones run only when their whole limit still fits. Every ring the tests build waits at
most RINGCOMM_TEST_RING_TIMEOUT (20 s) and pytest stops a test after 30 s (the sweep: 75 s), so
a hang costs about half a minute, not a stage.
"""
from dataclasses import dataclass, field
from pathlib import Path

BUDGET = 345  # seconds for all stages; + the kill slack and bundling stays under 6 minutes
TEST_TIMEOUT = 30
GPU_TESTS = "tests/test_gpu.py"

# pytest node ids per test stage, in run order (RINGCOMM_TEST_WORLDS=2 for all but world 4).
TESTS = {
    "tests_correct": [f"{GPU_TESTS}::test_world2_every_collective_dtype_op_exact_in_one_launch",
                      f"{GPU_TESTS}::test_ddp_hook_on_cuda_matches_stock_ddp",
                      f"{GPU_TESTS}::test_torch_backend_on_cuda"],
    "tests_failures": [f"{GPU_TESTS}::test_stream_semantics_and_graphs",
                       f"{GPU_TESTS}::test_timeout_names_peers",
                       f"{GPU_TESTS}::test_missing_peer_times_out_at_creation"],
    "tests_p2p_one_hop": [f"{GPU_TESTS}::test_point_to_point_and_all_to_all",
                          f"{GPU_TESTS}::test_python_point_to_point_on_cuda",
                          f"{GPU_TESTS}::test_publication_rounds",
                          f"{GPU_TESTS}::test_one_hop_all_reduce_exact"],
    "tests_rest": [f"{GPU_TESTS}::test_python_api_on_cuda_tensors",
                   f"{GPU_TESTS}::test_every_primitive",
                   f"{GPU_TESTS}::test_wire_all_reduce",
                   f"{GPU_TESTS}::test_nccl_loads_and_makes_ids",
                   f"{GPU_TESTS}::test_reduce_kernel_exact",
                   f"{GPU_TESTS}::test_wire_reduce_kernel_matches_cpu"],
    "tests4": [f"{GPU_TESTS}::test_every_primitive", f"{GPU_TESTS}::test_wire_all_reduce"],
}


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


def plan(python, work, probes, pytest_timeout=True):
    """The stages, in order. `work` holds everything that goes into the bundle; `probes` the
    scripts of the env and info stages."""
    py = [python]

    def tests(name, worlds="2"):
        argv = py + ["-m", "pytest", *TESTS[name], "-v", "-rA", "-p", "no:cacheprovider",
                     f"--junitxml={Path(work) / (name + '.xml')}"]
        if pytest_timeout:
            argv.append(f"--timeout={TEST_TIMEOUT}")
        return dict(argv=argv, env={"RINGCOMM_TEST_WORLDS": worlds}, junit=name + ".xml",
                    tests=list(TESTS[name]))

    def allreduce(world):
        return py + ["bench/gpu_allreduce.py", "--world", str(world), "--mib", "64", "256",
                     "--slices-mib", "4", "16", "32", "--json",
                     str(Path(work) / f"allreduce{world}.json")]

    return [
        Stage("env", 15, py + ["-c", probes["env"]], marker="ENV_JSON ", needs_gpu=False),
        Stage("build", 75, py + ["setup.py", "build_ext", "--inplace"]),
        Stage("info", 10, py + ["-c", probes["info"]], marker="INFO_JSON "),
        Stage("tests_correct", 100, **tests("tests_correct")),
        Stage("tests_failures", 60, **tests("tests_failures")),
        Stage("tests_p2p_one_hop", 55, **tests("tests_p2p_one_hop")),
        Stage("allreduce2", 30, allreduce(2), result="allreduce2.json"),
        Stage("kernels", 20, py + ["bench/gpu_kernels.py", "--mib", "256", "--json",
                                   str(Path(work) / "kernels.json")], result="kernels.json",
              optional=True),
        Stage("tests_rest", 90, **tests("tests_rest"), optional=True),
        Stage("allreduce4", 40, allreduce(4), result="allreduce4.json", optional=True),
        Stage("tests4", 90, **tests("tests4", worlds="4"), optional=True),
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


def stage_counts(record, junit):
    """{ran, passed, failed, skipped} of one stage: its tests from the JUnit counts, else the
    stage itself as one (passed when it exited 0)."""
    if record.get("skipped"):
        return {"ran": 0, "passed": 0, "failed": 0, "skipped": 0}
    if junit is not None and "tests" in junit:
        failed = junit["failures"] + junit["errors"]
        ran = junit["tests"] - junit["skipped"]
        return {"ran": ran, "passed": ran - failed, "failed": failed, "skipped": junit["skipped"]}
    ok = record.get("rc") == 0 and not record.get("timed_out")
    return {"ran": 1, "passed": int(ok), "failed": int(not ok), "skipped": 0}


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
        if stage.tests and counts["ran"] == 0 and not stage.optional:
            return "fail"  # every test skipped (no GPU, or no CUDA build): nothing was verified
        if record.get("timed_out") and not stage.optional:
            incomplete = True
    return "incomplete" if incomplete else "pass"
