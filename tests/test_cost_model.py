"""bench/cost_model.py: the alpha-beta model's formulas, its calibration and its outputs."""
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import cost_model as cm  # noqa: E402

INTRA = cm.Link(alpha=2e-6, beta=1 / 10e9)
INTER = cm.Link(alpha=5e-6, beta=1 / 25e9)
MACHINE = cm.Machine(INTRA, INTER, ranks_per_node=8)


def test_fit_recovers_alpha_and_beta_from_ring_times():
    alpha, beta = 7e-6, 1 / 3.5e9
    records = [{"collective": "all_reduce", "impl": "ringcomm", "nranks": n, "size": s,
                "time_us": 1e6 * (2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta)}
               for n in (2, 4) for s in (8, 4096, 1 << 20, 64 << 20)]
    records.append({"collective": "all_reduce", "impl": "gloo", "nranks": 2, "size": 8,
                    "time_us": 1e6})  # other implementations are ignored
    fitted = cm.fit(records)
    assert fitted == pytest.approx((alpha, beta), rel=1e-9)


def test_fit_refuses_records_that_cannot_determine_both():
    with pytest.raises(ValueError, match="two sizes"):
        cm.fit([{"collective": "all_reduce", "impl": "ringcomm", "nranks": 2, "size": 8,
                      "time_us": 10.0}])


@pytest.mark.parametrize("n", [2, 3, 8, 100, 4096])
def test_bandwidth_optimal_algorithms_share_the_ring_bandwidth_term(n):
    link = cm.Link(alpha=0.0, beta=1e-9)
    size = 1 << 30
    expected = 2 * (n - 1) / n * size * link.beta
    assert cm.ring(n, size, link) == pytest.approx(expected)
    assert cm.two_shot(n, size, link) == pytest.approx(expected)
    if n & (n - 1) == 0:  # halving-doubling is bandwidth-optimal for powers of two
        assert cm.halving_doubling(n, size, link) == pytest.approx(expected)
    else:  # and pays the fold of the extra ranks otherwise
        assert cm.halving_doubling(n, size, link) > expected


def test_latency_terms_count_the_steps():
    link = cm.Link(alpha=1.0, beta=0.0)
    assert cm.ring(4, 8, link) == 6  # 2(N-1) steps
    assert cm.recursive_doubling(8, 8, link) == 3
    assert cm.recursive_doubling(6, 8, link) == 2 + 2  # log2(4) steps plus the fold in and out
    assert cm.halving_doubling(16, 8, link) == 8
    assert cm.one_shot(8, 8, link) == 1 and cm.two_shot(8, 8, link) == 2


def test_small_messages_leave_the_ring_and_large_ones_come_back_to_bandwidth_optimal():
    name, t, t_ring = cm.best(8, 8, MACHINE)
    assert name == "one-shot" and t_ring / t > 10
    name, _, _ = cm.best(8, 1 << 30, MACHINE)
    assert name in ("ring", "two-shot")
    # Across nodes a flat ring's latency grows with N: at 4096 ranks, 8 B is far off the best.
    name, t, t_ring = cm.best(4096, 8, MACHINE)
    assert name == "recursive-doubling" and t_ring / t > 100


def test_two_level_uses_every_local_rank_across_nodes():
    # Fast in-node links: the two-level plan moves S/G per rank between nodes and beats a flat
    # ring that runs at the inter-node pace.
    fast = cm.Machine(cm.Link(1e-6, 1 / 200e9), INTER, 8)
    assert cm.two_level(64, 1 << 30, fast) < cm.ring(64, 1 << 30, INTER)


def test_command_line_prints_the_table_and_writes_json_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_json, out_png = tmp_path / "model.json", tmp_path / "best.png"
    cm.main(["--json", str(out_json), "--plot", str(out_png)])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(cm.RANKS) * len(cm.SIZES)
    rows = json.loads(out_json.read_text())
    assert {r["ranks"] for r in rows} == set(cm.RANKS)
    assert all(math.isfinite(r["ring"]) and r["ring"] > 0 for r in rows)
    assert out_png.stat().st_size > 10_000


def test_fit_inter_recovers_the_links_between_nodes_from_two_level_times():
    machine = cm.Machine(cm.Link(9e-6, 1 / 5e9), cm.Link(80e-6, 1 / 0.2e9), 2)
    records = [{"collective": "all_reduce", "impl": "ringcomm", "nranks": 4, "size": s,
                "time_us": cm.two_level(4, s, machine) * 1e6}
               for s in (8, 1 << 15, 1 << 20, 1 << 26)]
    alpha, beta = cm.fit_inter(records, machine)
    assert alpha == pytest.approx(80e-6, rel=1e-6) and beta == pytest.approx(1 / 0.2e9, rel=1e-6)
    with pytest.raises(ValueError, match="across hosts"):
        cm.fit_inter(records[:1], machine)


def _between_hosts_records(bh, model, cores=2):
    """Synthetic per-call medians of `model` on emulated hosts: 2, 4, 8 hosts x 1 and 4 x 2."""
    return [{"collective": c, "impl": f"ringcomm-{a}", "nranks": h * per_host, "hosts": h,
             "cores": cores, "size": s, "inplace": True,
             "p50_us": bh.predicted_us(model, c, a, h, s, h * per_host / cores, per_host)}
            for c in bh.COLLECTIVES for a in bh.ALGORITHMS
            for h, per_host in ((2, 1), (4, 1), (8, 1), (4, 2))
            for s in (8, 4096, 1 << 18, 1 << 21, 1 << 24, 1 << 26)]


BETWEEN_HOSTS = dict(call=30e-6, hop_ring=40e-6, hop_recursive_doubling=55e-6, level=800e-6,
                     beta=1 / 350e6, host_byte_ring=1.2e-9, host_byte_recursive_doubling=0.7e-9)


def test_between_hosts_fit_recovers_every_term_from_the_models_own_times(tmp_path):
    import between_hosts_model as bh

    model = bh.Model(**BETWEEN_HOSTS)
    records = _between_hosts_records(bh, model)
    records.append(dict(records[0], impl="gloo"))  # other implementations are ignored
    path = tmp_path / "between_hosts.json"
    path.write_text(json.dumps(records))
    points = bh.load([str(path)], cores=2)
    fitted = bh.fit(points)
    for name in bh.PARAMETERS:
        assert getattr(fitted, name) == pytest.approx(getattr(model, name), rel=1e-9), name
    assert all(abs(r["error"]) < 1e-9 for r in bh.errors(points, fitted))
    # Each term was the largest somewhere: the ring's CPU at 4 ranks per core, not at 1.
    assert bh.predicted_us(model, "all_reduce", "ring", 8, 1 << 26, 4) > \
        bh.predicted_us(model.__class__(**dict(BETWEEN_HOSTS, host_byte_ring=0)), "all_reduce",
                        "ring", 8, 1 << 26, 4)


def test_between_hosts_load_takes_each_points_median_over_launches(tmp_path):
    import between_hosts_model as bh

    record = {"collective": "all_gather", "impl": "ringcomm-recursive_doubling", "nranks": 8,
              "hosts": 4, "cores": 2, "size": 64, "inplace": False}
    path = tmp_path / "launches.json"
    path.write_text(json.dumps([dict(record, p50_us=t) for t in (300.0, 100.0, 200.0)]))
    (point,) = bh.load([str(path)], cores=16)
    assert point["time_us"] == 200.0 and point["ranks_per_core"] == 4.0
    assert point["per_host"] == 2 and point["launches"] == [300.0, 100.0, 200.0]


def test_between_hosts_command_line_prints_errors_projection_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import between_hosts_model as bh

    path, png = tmp_path / "between_hosts.json", tmp_path / "model.png"
    path.write_text(json.dumps(_between_hosts_records(bh, bh.Model(**BETWEEN_HOSTS))))
    bh.main([str(path), "--plot", str(png), "--alpha-us", "5", "--gbps", "25"])
    out = capsys.readouterr().out
    assert "# worst: " in out and "144 of 144 within 25%" in out
    assert "| all_gather | 1024 | 64M |" in out and "3125 MB/s" in out
    assert png.stat().st_size > 10_000


def test_between_hosts_projection_on_real_hosts():
    import between_hosts_model as bh

    model = bh.Model(**BETWEEN_HOSTS)
    rows = {(c, h, s): (faster, ring, log_step, auto)
            for c, h, s, faster, ring, log_step, auto in bh.projection(model)}
    # 1,024 hosts, 8 B: 10 rounds against the ring's 2,046 hops.
    faster, ring, log_step, auto = rows["all_reduce", 1024, 8]
    assert faster == "recursive_doubling" and ring / log_step > 50 and auto == log_step
    # All_reduce's doubled bytes: the ring from some size on, where auto has switched too.
    faster, ring, _, auto = rows["all_reduce", 64, 64 << 20]
    assert faster == "ring" and auto == ring
    # One rank per core on a Network: the sum of latency and link, no emulated contention.
    network = bh.Network(alpha=10e-6, beta=1 / 1e9)
    t = bh.predicted_us(model, "all_gather", "ring", 64, 8, network=network)
    assert t == pytest.approx(1e6 * (model.call + 63 * (model.hop_ring + 10e-6)) + 63 / 64 * 8e-3)
    # The model's crossover is where the two algorithms' times meet.
    s = bh.model_crossover(model, "all_reduce", 64)
    assert bh.predicted_us(model, "all_reduce", "recursive_doubling", 64, s, network=bh.Network()) \
        <= bh.predicted_us(model, "all_reduce", "ring", 64, s, network=bh.Network()) * (1 + 1e-9)
    assert bh.predicted_us(model, "all_reduce", "recursive_doubling", 64, 2 * s,
                           network=bh.Network()) > \
        bh.predicted_us(model, "all_reduce", "ring", 64, 2 * s, network=bh.Network())


def test_log_step_max_bytes_matches_the_headers_documented_switch_points():
    import between_hosts_model as bh

    # docs/benchmarks.md: 3 hosts 26,106 B / 81 B, 4 hosts 202,730 B, 8 hosts 208,468 B.
    assert bh.log_step_max_bytes("all_reduce", 3) == 26106
    assert bh.log_step_max_bytes("reduce_scatter", 3) == 81
    assert bh.log_step_max_bytes("all_reduce", 4) == 202730
    assert bh.log_step_max_bytes("all_reduce", 8) == 208468
    assert bh.log_step_max_bytes("all_gather", 8) == 256 << 10
    assert bh.log_step_max_bytes("all_reduce", 1) == 0
