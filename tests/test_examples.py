"""The training examples, small: each runs as a user would run it (2 local CPU ranks, a real
subprocess) and its comparison with gloo or DDP holds bit for bit at 2 ranks. Correctness only:
the step times they print are not asserted."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # runs the example programs

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--steps", "4", "--warmup", "1", "--width", "64"]


def run_example(name, *args):
    import ringcomm

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        str(Path(ringcomm.__file__).parent.parent), os.environ.get("PYTHONPATH")])))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("name, agreement", [
    ("train_fsdp.py", "ringcomm against gloo: bitwise identical"),
    ("train_tp.py", "ringcomm against gloo: bitwise identical"),
    ("train_zero.py", "ZeRO against DDP: bitwise identical"),
])
def test_example_matches_its_baseline(name, agreement):
    out = run_example(name, *SMALL, "--layers" if name != "train_tp.py" else "--blocks", "2")
    assert agreement in out, out
    assert "median step time" in out


def test_tensor_parallel_matches_one_process():
    out = run_example("train_tp.py", *SMALL)
    for backend in ("gloo", "ringcomm"):
        line = next(l for l in out.splitlines() if l.startswith(f"{backend} against one process"))
        losses = float(line.split("losses ")[1].split(",")[0])
        assert losses < 1e-5, line  # the same math, summed in another order


def test_zero_shards_the_optimizer_state():
    out = run_example("train_zero.py", *SMALL, "--layers", "2")
    line = next(l for l in out.splitlines() if l.startswith("Adam state per rank"))
    assert line.endswith("(0.50x)"), line


def test_plain_ddp_on_the_backend_matches_stock_ddp():
    out = run_example("train_ddp.py", "--steps", "4", "--warmup", "1", "--width", "64",
                      "--layers", "2", "--hooks", "allreduce_hook")
    assert "DDP on ringcomm against stock DDP: losses bitwise identical" in out, out


def test_losing_a_rank_the_survivors_reconfigure_and_go_on():
    import torch.distributed as dist

    if not hasattr(dist, "_reconfigure"):
        pytest.skip("this torch has no reconfigure API (dist._reconfigure, torch 2.14 or later)")
    out = run_example("lose_a_rank.py", "--backend", "ringcomm", "--steps", "6", "--kill-at", "3",
                      "--width", "64")
    assert "generation 2: members [0, 2]" in out, out
    assert "steps: 3 on 3 ranks before the kill, 3 on 2 ranks after" in out, out
    assert "survivors' parameters: bitwise identical" in out, out
