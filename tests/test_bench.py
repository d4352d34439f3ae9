"""Smoke test of the benchmark: bench/run.py really runs (2 CPU ranks, tiny sizes, every
collective), validates, and writes the documented JSON and a PNG. No timing assertions."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402
import records  # noqa: E402
import sizes  # noqa: E402
import ringcomm  # noqa: E402
from ringcomm import _C  # noqa: E402

KEYS = {"collective", "impl", "size", "count", "type", "redop", "inplace", "time_us", "algbw",
        "busbw", "wrong", "nranks", "device", "p50_us", "p99_us", "calls"}
COLLECTIVES = list(_C.COLLECTIVES)  # every collective the C++ table has is benchmarked


def test_percentiles_interpolate_between_ranks():
    assert records.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert records.percentile([1.0, 2.0], 50) == 1.5
    assert records.percentile(list(map(float, range(101))), 99) == 99.0


def test_sizes_parse_like_nccl_tests():
    assert [sizes.parse_size(s) for s in ("8", "1K", "64M", "1G", "2kb")] == \
        [8, 1024, 64 << 20, 1 << 30, 2048]
    with pytest.raises(ValueError):
        sizes.parse_size("lots")
    assert sizes.sweep(8, 64 << 20, 8)[-2:] == [16 << 20, 64 << 20]  # -e is always measured
    assert sizes.sweep(8, 64, 2) == [8, 16, 32, 64]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6])
def test_rounds_let_each_implementation_follow_every_other_equally_often(k):
    cycle = k if k % 2 == 0 else 2 * k
    follows = {}
    for r in range(cycle):
        order = harness.balanced_order(k, r)
        assert sorted(order) == list(range(k))
        for pair in zip(order, order[1:]):
            follows[pair] = follows.get(pair, 0) + 1
    assert len(follows) == k * (k - 1) and len(set(follows.values())) <= 1


@pytest.mark.system  # runs the benchmark script
def test_run_writes_checked_records(tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--device", "cpu", "--nproc", "2",
           "-b", "8", "-e", "4K", "-f", "32", "-n", "2", "-w", "1", "--collective", "all",
           "--json", str(out), "--plot", str(plot)]
    # ringcomm as the test process sees it (installed, or the checkout when run in place).
    import ringcomm

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(ringcomm.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    records = json.loads(out.read_text())
    assert {r["collective"] for r in records} == set(COLLECTIVES)
    assert {r["impl"] for r in records} == {"ringcomm", "gloo"}
    for r in records:
        assert KEYS <= r.keys(), r
        assert r["wrong"] == 0, r
        assert r["nranks"] == 2 and r["device"] == "cpu" and r["type"] == "float"
        assert r["time_us"] > 0 and r["busbw"] >= 0
        assert 0 < r["p50_us"] <= r["p99_us"] and r["calls"] == 2  # -n 2, one round
        if r["impl"] == "gloo":
            assert r["moved_per_byte"] is None
        elif r["collective"] == "all_reduce":  # 2(N-1)/N of it on the ring, all of it one_shot
            assert r["moved_per_byte"] == pytest.approx(1.0), r
        else:
            assert r["moved_per_byte"] > 0, r
    # In-place only where the API is in place; both variants for the rest.
    variants = {(r["collective"], r["inplace"]) for r in records}
    assert ("all_reduce", False) not in variants and ("all_gather", False) in variants
    assert "ringcomm/gloo busbw" in proc.stdout and "memcpy ceiling" in proc.stdout
    assert "moved" in proc.stdout and "(B/B)" in proc.stdout
    # The ceiling is sampled again after every round: each collective's summary has more copies.
    summaries = re.findall(r"# memcpy ceiling: median ([\d.]+) GB/s of (\d+) copies .*busbw at "
                           r"(\d+) B / ceiling: ringcomm ([\d.e+-]+), gloo ([\d.e+-]+)", proc.stdout)
    assert len(summaries) == len({r["collective"] for r in records}), proc.stdout
    copies = [int(s[1]) for s in summaries]
    assert copies == sorted(set(copies)) and copies[0] > 5, copies
    assert all(float(s[0]) > 0 and float(s[3]) > 0 for s in summaries), summaries
    # So is the round trip between the two ranks' cores, which the whole launch depends on.
    if len(os.sched_getaffinity(0)) >= 2:
        trips = re.findall(r"# core-to-core round trip: CPUs (\d+) and (\d+): median (\d+) ns "
                           r"\((\d+)-(\d+)\) of (\d+) samples", proc.stdout)
        assert len(trips) == 1 + len(summaries), proc.stdout
        assert [int(t[5]) for t in trips] == [1] + [c - 4 for c in copies], trips  # 5 copies first
        assert all(t[0] != t[1] and 0 < int(t[3]) <= int(t[2]) <= int(t[4]) for t in trips)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bench_records(tmp_path, *args, timeout=120):
    """bench/run.py run with `args`: the records it wrote as JSON, and what it printed."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "bench" / "run.py"), *args, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.system  # runs the benchmark script
def test_the_copy_baseline_times_each_ranks_copy_and_checks_nothing(tmp_path):
    """--baseline copy: every rank copies its buffer, exchanging nothing; the ratio column then
    says how close ringcomm comes to the memory's bound."""
    records, printed = _bench_records(tmp_path, "--device", "cpu", "--nproc", "2", "-b", "1K", "-e", "64K",
                                      "-f", "64", "-n", "2", "-w", "1", "--baseline", "copy")
    copies = [r for r in records if r["impl"] == "copy"]
    assert len(copies) == 2 and all(r["wrong"] is None and r["time_us"] > 0 for r in copies)
    assert all(r["wrong"] == 0 for r in records if r["impl"] == "ringcomm")
    assert "ringcomm/copy busbw" in printed


# -- bench/tune.py: every algorithm, thresholds, targets ----------------------------------------

import tune  # noqa: E402
import tune_analysis  # noqa: E402
from ringcomm.options import IN_HOST_ALGORITHMS as ALGORITHMS  # noqa: E402 (tune.py's)


def _env():
    import ringcomm

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(ringcomm.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    return env


@pytest.mark.system  # runs the benchmark script
def test_tune_times_every_algorithm_and_writes_the_analysis(tmp_path):
    out, plot = tmp_path / "tune.json", tmp_path / "tune.png"
    cmd = [sys.executable, str(ROOT / "bench" / "tune.py"), "--nproc", "2", "-b", "8", "-e", "512",
           "-f", "64", "-n", "2", "-w", "1", "--rounds", "2", "--load", "1", "--json", str(out),
           "--plot", str(plot)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data.keys() == {"records", "analysis", "environment"}
    records = data["records"]
    colls = {r["collective"] for r in records}
    assert colls == set(tune.tuned_collectives()) and "all_reduce" in colls
    # Every algorithm the build offers, read from ringcomm.options, beside gloo.
    ar = [r for r in records if r["collective"] == "all_reduce"]
    assert {r["impl"] for r in ar} == {f"ringcomm-{a}" for a in ALGORITHMS} | {"gloo"}
    for r in records:
        assert KEYS <= r.keys() and r["wrong"] == 0, r
        assert len(r["rounds_us"]) == 2 and r["spread_us"] >= 0
        assert r["size"] in (8, 512)
    result = data["analysis"]["all_reduce"]
    assert [row["size"] for row in result["rows"]] == [8, 512]
    assert set(result["thresholds"]) == set(tune_analysis.one_hop(ALGORITHMS))
    assert set(result["rows"][0]["vs_ring"]) == set(ALGORITHMS) | {"gloo"}
    assert result["rows"][0]["fastest"] in set(ALGORITHMS) - {"auto"} | {"gloo"}
    assert isinstance(result["selector_violations"], list)
    small = result["targets"]["small"]
    assert small["size"] == 8 and small["gloo_us"] > 0 and "best_met" in small
    assert result["targets"]["large"] is None  # 64 MiB not measured here
    env = data["environment"]
    assert env["busy_processes"] == 1 and env["nranks"] == 2 and env["rounds"] == 2
    for name in tune_analysis.one_hop(ALGORITHMS):
        assert f"RINGCOMM_{name.upper()}_MAX_BYTES=" in proc.stdout
    assert "target, 8 B all_reduce, 2 ranks" in proc.stdout and "selector check" in proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Launches pooled: twice the rounds per size, one analysis, both launches' environments.
    merged = tmp_path / "merged.json"
    tune.main(["--merge", str(out), str(out), "--json", str(merged)])
    pooled = json.loads(merged.read_text())
    assert len(pooled["records"]) == len(records)
    assert all(len(r["rounds_us"]) == 4 for r in pooled["records"])
    assert len(pooled["environment"]["launches"]) == 2
    assert pooled["analysis"]["all_reduce"]["thresholds"].keys() == result["thresholds"].keys()


def test_collectives_that_take_an_algorithm_are_detected():
    from collectives import COLLECTIVES

    import run

    assert run.takes_algorithm(COLLECTIVES["all_reduce"])
    assert tune.tuned_collectives()[0] == "all_reduce"
    assert all(run.takes_algorithm(COLLECTIVES[c]) for c in tune.tuned_collectives())


def test_an_algorithm_the_communicator_refuses_is_left_out(tmp_path, capsys):
    import torch
    import torch.distributed as dist
    from collectives import COLLECTIVES

    import ringcomm
    import run

    # A real refusal: two_shot plans all_reduce only.
    coll = COLLECTIVES["reduce_scatter"]
    args = run.parse_args(["--device", "cpu", "--algorithm", "ring,two_shot"])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        comm = ringcomm.Communicator(timeout=10)
        impls = run._ringcomm_impls(comm, coll, args, torch.device("cpu"))
        assert [i.name for i in impls] == ["ringcomm-ring"]
        assert "refuses algorithm two_shot" in capsys.readouterr().out
        t = torch.ones(3)
        comm.all_reduce(t, algorithm="two_shot")  # still usable after the refusal
        assert t.tolist() == [1.0, 1.0, 1.0]
        comm.close()
    finally:
        dist.destroy_process_group()


def _times(**curves):
    """{algorithm: {size: seconds}} from {algorithm: [seconds at SIZES]}."""
    return {name: dict(zip(SIZES, ts)) for name, ts in curves.items()}


SIZES = [8 << (2 * i) for i in range(8)]  # 8 B .. 128 KiB, x4


def test_threshold_is_the_last_size_a_one_hop_algorithm_wins():
    times = _times(ring=[10, 10, 10, 12, 20, 50, 150, 500],
                   one_shot=[4, 4, 5, 7, 15, 60, 300, 2000])
    assert tune_analysis.suggest_thresholds(times, ["one_shot"]) == {"one_shot": 2048}


def test_thresholds_for_two_algorithms_in_their_order():
    times = _times(ring=[10, 10, 10, 12, 20, 50, 150, 500],
                   one_shot=[4, 4, 5, 8, 30, 90, 300, 2000],
                   two_shot=[6, 6, 6, 9, 16, 40, 140, 520])
    assert tune_analysis.suggest_thresholds(times, ["one_shot", "two_shot"]) == \
        {"one_shot": 512, "two_shot": 32768}
    thresholds = {"one_shot": 512, "two_shot": 32768}
    assert [tune_analysis.select(s, thresholds) for s in (8, 512, 2048, 32768, 131072)] == \
        ["one_shot", "one_shot", "two_shot", "two_shot", "ring"]


def test_select_is_the_communicators_own_rule():
    """tune_analysis.select asks _C.choose_algorithm: at 2 ranks two_shot saves no hop over the
    ring and is never chosen; reduce_scatter runs one_shot up to the two_shot threshold."""
    thresholds = {"one_shot": 512, "two_shot": 32768}
    assert tune_analysis.select(2048, thresholds, world=4) == "two_shot"
    assert tune_analysis.select(2048, thresholds, world=2) == "ring"
    assert tune_analysis.select(512, thresholds, world=2) == "one_shot"
    assert tune_analysis.select(2048, {"one_shot": 4096}, collective="reduce_scatter",
                                world=4) == "one_shot"
    assert tune_analysis.select(2048, {"one_shot": 4096}, collective="reduce_scatter",
                                world=2) == "ring"


def test_thresholds_never_and_always_and_ties():
    ring = [10] * 8
    assert tune_analysis.suggest_thresholds(_times(ring=ring, one_shot=[11] * 8), ["one_shot"]) == \
        {"one_shot": 0}
    assert tune_analysis.suggest_thresholds(_times(ring=ring, one_shot=[9] * 8), ["one_shot"]) == \
        {"one_shot": SIZES[-1]}
    # Equal times: the ring keeps the size (the default stays unless measured better).
    assert tune_analysis.suggest_thresholds(_times(ring=ring, one_shot=ring), ["one_shot"]) == \
        {"one_shot": 0}
    # An algorithm never picked inside its threshold range reads 0, not a meaningless size.
    times = _times(ring=ring, one_shot=[5] * 8, two_shot=[6] * 8)
    assert tune_analysis.suggest_thresholds(times, ["one_shot", "two_shot"]) == \
        {"one_shot": SIZES[-1], "two_shot": 0}
    # Algorithms not measured are left out; nothing measured at all gives no threshold.
    assert tune_analysis.suggest_thresholds(_times(ring=ring), ["one_shot", "two_shot"]) == {}


def test_thresholds_weigh_a_noisy_loss_against_a_larger_gain():
    # one_shot loses 10 % at 512 B (noise) but wins 2x at 2 KiB: it should keep 2 KiB.
    times = _times(ring=[10, 10, 10, 10, 20, 50, 150, 500],
                   one_shot=[5, 5, 5, 11, 10, 100, 300, 1000])
    assert tune_analysis.suggest_thresholds(times, ["one_shot"]) == {"one_shot": 2048}


def test_merge_pools_the_rounds_of_every_launch():
    def rec(rounds):
        return {"collective": "all_reduce", "impl": "ringcomm-ring", "size": 1000,
                "inplace": True, "rounds_us": rounds, "time_us": 0, "spread_us": 0,
                "algbw": 1.0, "busbw": 1.0, "wrong": 0}
    (r,) = tune.merge([[rec([10.0, 30.0])], [rec([20.0, 40.0, 50.0])]])
    assert r["rounds_us"] == [10.0, 30.0, 20.0, 40.0, 50.0]
    assert r["time_us"] == pytest.approx(30.0) and r["spread_us"] == pytest.approx(20.0)
    assert r["algbw"] == pytest.approx(1000 / 30e-6 / 1e9) and r["busbw"] == r["algbw"]


def _row(size, times, spreads=None):
    return {"size": size, "time_us": times,
            "spread_us": spreads or {n: 0.0 for n in times}}


def test_selector_check_counts_only_losses_beyond_the_noise():
    rows = [_row(8, {"ring": 10.0, "auto": 10.5}, {"ring": 1.0, "auto": 0.2}),   # within noise
            _row(64, {"ring": 10.0, "auto": 13.0}, {"ring": 1.0, "auto": 2.0}),  # 3 > 2: slower
            _row(512, {"ring": 10.0, "auto": 4.0})]                            # faster
    bad = tune_analysis.selector_violations(rows)
    assert [v["size"] for v in bad] == [64]
    assert bad[0]["noise_us"] == 2.0 and bad[0]["ratio"] == pytest.approx(1.3)


def test_targets_judge_time_ratio_and_busbw():
    rows = [_row(8, {"ring": 12.0, "one_shot": 4.0, "auto": 5.0, "gloo": 1000.0}),
            _row(64 << 20, {"ring": 20e3, "one_shot": 50e3, "auto": 21e3, "gloo": 62e3})]
    t = tune_analysis.targets(rows, 2)
    assert t["small"]["best"] == "one_shot" and t["small"]["best_met"]  # 4 us, 0.004x
    assert t["small"]["selector_us"] == 5.0 and t["small"]["selector_met"]
    assert t["large"]["best"] == "ring" and t["large"]["best_met"]  # 3.1x gloo's busbw
    assert not t["large"]["selector_met"]  # 62/21 = 2.95x
    t4 = tune_analysis.targets([_row(8, {"ring": 30.0, "auto": 25.0, "gloo": 1500.0})], 4)
    assert not t4["small"]["best_met"] and t4["large"] is None


def test_analysis_of_records_picks_the_fastest_and_ratios():
    def rec(impl, size, us):
        return {"collective": "all_reduce", "impl": impl, "size": size, "inplace": True,
                "time_us": us, "spread_us": 0.5, "busbw": 1.0, "wrong": 0}
    records = [rec("ringcomm-ring", 8, 10), rec("ringcomm-one_shot", 8, 5),
               rec("ringcomm-auto", 8, 4), rec("gloo", 8, 1000),
               rec("ringcomm-ring", 1 << 20, 100), rec("ringcomm-one_shot", 1 << 20, 300),
               rec("ringcomm-auto", 1 << 20, 300), rec("gloo", 1 << 20, 2000)]
    result = tune_analysis.analyse(records, 2)["all_reduce"]
    assert [row["fastest"] for row in result["rows"]] == ["one_shot", "ring"]  # auto aside
    assert result["rows"][0]["vs_ring"]["one_shot"] == 0.5
    assert result["rows"][1]["vs_gloo"]["ring"] == 0.05
    assert result["thresholds"] == {"one_shot": 8}
    assert [v["size"] for v in result["selector_violations"]] == [1 << 20]


@pytest.mark.skipif(not _C.build_info()["cuda"], reason="built without CUDA")
@pytest.mark.parametrize("world,mib,groups", [(2, 1, 2), (3, 6, 8)])
def test_gpu_host_calls_counts_one_group_per_step_and_slice(world, mib, groups):
    """2(n-1) steps; 6 MiB at 3 ranks is 2 MiB chunks: two 1 MiB slices a step."""
    import gpu_host_calls

    slice_mib = 1 if world == 3 else 4
    eager = gpu_host_calls.counts_per_call(world, mib, slice_mib, cuda_graphs=False)
    assert eager["ncclGroupEnd"] == groups
    assert eager["kernel launches"] == groups // 2  # one reduce per reduce-scatter slice
    replayed = gpu_host_calls.counts_per_call(world, mib, slice_mib)
    assert replayed.get("ncclGroupEnd", 0) == 0 and replayed["cudaGraphLaunch"] == 1, replayed


def test_core_round_trip_binds_a_thread_to_each_cpu_or_says_it_cannot():
    from ringcomm import _testing
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    assert _testing.core_round_trip_ns(cpus[0], cpus[1], rounds=2000, samples=3) > 0
    with pytest.raises(ringcomm.RingcommError, match="cannot bind a thread to CPU"):
        _testing.core_round_trip_ns(cpus[0], 1023, rounds=10, samples=1)


# -- --baseline mpi: MPI's collectives beside ringcomm's, the ranks started by MPI's mpiexec ----

import mpi_world  # noqa: E402


def _main_stops(argv):
    import run

    with pytest.raises(SystemExit) as stop:
        run.main(argv)
    return str(stop.value.code)


def test_without_mpi_the_mpi_baseline_names_the_pip_command_in_one_line(monkeypatch):
    """CI installs no [mpi] extra: --baseline mpi must stop with one line, not a traceback."""
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py raises ImportError
    message = _main_stops(["--baseline", "mpi", "--nproc", "2"])
    assert "\n" not in message and "mpi4py is not installed" in message, message
    assert "pip install 'ringcomm[mpi]'" in message and "pip install mpi4py mpich" in message
    # mpi4py there, but no mpiexec beside the interpreter nor on PATH.
    monkeypatch.setitem(sys.modules, "mpi4py", type(sys)("mpi4py"))
    monkeypatch.setattr(mpi_world, "_mpiexecs", lambda: [])
    message = _main_stops(["--baseline", "mpi", "--mpi", "mpich"])
    assert "\n" not in message and "no mpiexec of mpich found" in message, message
    assert "pip install mpi4py mpich" in message


def test_mpi_kinds_are_told_by_their_version_text():
    assert mpi_world.kind_of("mpiexec (Open MPI) 5.0.11") == "openmpi"
    assert mpi_world.kind_of("HYDRA build details:\n    Version: 5.0.2") == "mpich"
    assert mpi_world.kind_of("MPICH Version:      5.0.2") == "mpich"
    assert mpi_world.kind_of("Intel(R) MPI Library for Linux* OS, Version 2021.18") == "impi"
    assert mpi_world.kind_of("something else") is None


@pytest.mark.system  # runs the benchmark under mpiexec
def test_mpi_baseline_runs_under_mpiexec_and_checks_mpis_results(tmp_path):
    pytest.importorskip("mpi4py", reason="mpi4py not installed (pip install 'ringcomm[mpi]')")
    try:
        kind, _ = mpi_world.find()
    except SystemExit as stop:  # no mpiexec, or mpi4py cannot load its MPI
        pytest.skip(str(stop.code))
    records, printed = _bench_records(tmp_path, "--baseline", "mpi", "--nproc", "2", "-b", "8",
                                      "-e", "4K", "-f", "32", "-n", "2", "-w", "1",
                                      "--collective", "all", timeout=180)
    assert {r["collective"] for r in records} == set(COLLECTIVES)
    assert {r["impl"] for r in records} == {"ringcomm", kind}
    for r in records:
        assert KEYS <= r.keys() and r["nranks"] == 2 and r["device"] == "cpu", r
        assert r["wrong"] == 0 and r["time_us"] > 0, r  # MPI's results are checked too
    mpi = {(r["collective"], r["inplace"]) for r in records if r["impl"] == kind}
    assert {("all_reduce", True), ("all_gather", False), ("all_gather", True)} <= mpi
    # MPI's in-place reduce_scatter puts the block elsewhere than nccl-tests: not measured.
    assert ("reduce_scatter", False) in mpi and ("reduce_scatter", True) not in mpi
    assert f"ringcomm/{kind} busbw" in printed and "# MPI: " in printed
