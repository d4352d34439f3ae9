"""Smoke test of the benchmark: bench/run.py really runs (2 CPU ranks, tiny sizes, every
collective), validates, and writes the documented JSON and a PNG. No timing assertions."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import harness  # noqa: E402

KEYS = {"collective", "impl", "size", "count", "type", "redop", "inplace", "time_us", "algbw",
        "busbw", "wrong", "nranks", "device"}
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather",
               "scatter"]


def test_sizes_parse_like_nccl_tests():
    assert [harness.parse_size(s) for s in ("8", "1K", "64M", "1G", "2kb")] == \
        [8, 1024, 64 << 20, 1 << 30, 2048]
    with pytest.raises(ValueError):
        harness.parse_size("lots")
    assert harness.sweep(8, 64 << 20, 8)[-2:] == [16 << 20, 64 << 20]  # -e is always measured
    assert harness.sweep(8, 64, 2) == [8, 16, 32, 64]


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
    # In-place only where the API is in place; both variants for the rest.
    variants = {(r["collective"], r["inplace"]) for r in records}
    assert ("all_reduce", False) not in variants and ("all_gather", False) in variants
    assert "ringcomm/gloo busbw" in proc.stdout and "memcpy ceiling" in proc.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
