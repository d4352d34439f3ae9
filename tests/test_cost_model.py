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


def test_between_hosts_model_fits_each_algorithm_and_projects_the_faster():
    import between_hosts_model as bh

    links = {"ring": cm.Link(50e-6, 1 / 400e6), "recursive_doubling": cm.Link(30e-6, 1 / 500e6)}
    records = [{"collective": "all_reduce", "impl": f"ringcomm-{a}", "nranks": h, "size": s,
                "time_us": 1.0, "p50_us": bh.predicted_us(a, h, s, links)}
               for a in bh.ALGORITHMS for h in (2, 3, 8) for s in (8, 4096, 1 << 20)]
    fitted = bh.fit_links(bh.medians_of(records))
    for a in bh.ALGORITHMS:
        assert (fitted[a].alpha, fitted[a].beta) == pytest.approx(
            (links[a].alpha, links[a].beta), rel=1e-9)
    assert all(abs(row[5]) < 1e-9 for row in bh.errors(bh.medians_of(records), fitted))
    rows = {(h, s): (faster, auto, ring) for h, s, faster, auto, ring in bh.projection(fitted)}
    assert rows[1024, 8][0] == "recursive_doubling" and rows[1024, 8][1] < rows[1024, 8][2]
    assert rows[64, 16 << 20][0] == "ring"
    assert rows[64, 32768][1] == rows[64, 32768][2]  # above auto's threshold: the ring
