"""bench/ring_vs_master.py: the bytes each rank sends and receives, as the transport counts
them, follow the formulas exactly (counts, never times, are asserted)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import ring_vs_master  # noqa: E402


def test_counted_bytes_follow_ring_and_master_formulas(tmp_path):
    size = 48 * 1024  # chunks of 16-byte multiples at 2 and 3 ranks: the ring's shares are equal
    rows = ring_vs_master.main(["--ranks", "2,3", "--size", str(size), "--iters", "2",
                                "--json", str(tmp_path / "r.json"),
                                "--plot", str(tmp_path / "r.png")])
    assert (tmp_path / "r.png").stat().st_size > 0
    assert {(r["ranks"], r["method"]) for r in rows} == {
        (n, m) for n in (2, 3) for m in ring_vs_master.METHODS}
    for row in rows:
        n, method = row["ranks"], row["method"]
        assert row["wrong"] == 0, row
        if method == "ring":
            share = 2 * (n - 1) * size // n
            assert row["sent"] == [share] * n and row["received"] == [share] * n, row
        elif method == "master":
            assert row["sent"] == [(n - 1) * size] + [size] * (n - 1), row
            assert row["received"] == [(n - 1) * size] + [size] * (n - 1), row
        else:
            assert row["sent"] == [(n - 1) * size] * n == row["received"], row
