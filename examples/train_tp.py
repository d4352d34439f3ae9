"""Tensor parallelism through DTensor on the "ringcomm" backend: each MLP block's first linear
layer split by columns and its second by rows (Megatron-style), so every block's forward ends
in an all_reduce of its activations and its backward in an all_reduce of its input gradients.

Every rank sees the same batches (tensor parallelism splits the model, not the data). The same
training runs three ways: on one process with the whole model (the reference), tensor-parallel
on gloo, and tensor-parallel on ringcomm; the script prints the losses, the largest differences
to the reference and between the backends, and the median step time of both backends.

    python examples/train_tp.py                       # 2 local CPU ranks
    python examples/train_tp.py --ranks 4 --width 1024
    torchrun --nproc-per-node 2 examples/train_tp.py
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch  # noqa: E402

import ringcomm  # noqa: E402,F401  registers the "ringcomm" backend

BACKENDS = ("gloo", "ringcomm")


def parse_args(argv=None):
    p = launch.arguments(__doc__)
    p.add_argument("--blocks", type=int, default=2, help="MLP blocks (colwise then rowwise)")
    return p.parse_args(argv)


class Block(nn.Module):
    def __init__(self, dim, width):
        super().__init__()
        self.up, self.down = nn.Linear(dim, width), nn.Linear(width, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def make_model(args):
    torch.manual_seed(0)
    return nn.Sequential(*(Block(64, args.width) for _ in range(args.blocks)))


def batch(args, step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(args.batch, 64, generator=g)
    return x, torch.tanh(x.flip(1))


def train(args, model):
    """(losses, step times, final parameters as full tensors) of plain SGD with momentum."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(i):
        x, y = batch(args, i)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    losses, times = launch.timed_steps(args, step)
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
              for p in model.parameters()]
    return losses, times, params


def tensor_parallel(args, group):
    mesh = DeviceMesh.from_group(group, "cpu")
    plan = {}
    for i in range(args.blocks):
        plan[f"{i}.up"], plan[f"{i}.down"] = ColwiseParallel(), RowwiseParallel()
    return parallelize_module(make_model(args), mesh, plan)


def main(rank, world_size, args):
    if args.width % world_size:
        raise SystemExit(f"--width {args.width} must be a multiple of the {world_size} ranks")
    runs = {"one process": train(args, make_model(args))}
    for backend in BACKENDS:
        runs[backend] = train(args, tensor_parallel(args, dist.new_group(backend=backend)))
    step_s = {b: launch.slowest_median(runs[b][1]) for b in BACKENDS}
    if rank == 0:
        report(args, world_size, runs, step_s)


def report(args, world_size, runs, step_s):
    reference = runs["one process"]
    print(f"tensor parallel on {world_size} ranks: {args.blocks} MLP blocks 64 -> {args.width} "
          f"-> 64 (up colwise, down rowwise), batch {args.batch}, {args.steps} steps")
    print(f"{'step':>6}" + "".join(f"{name + ' loss':>20}" for name in runs))
    for step in sorted({0, args.steps - 1, *range(0, args.steps, max(1, args.steps // 5))}):
        print(f"{step:>6}" + "".join(f"{r[0][step]:>20.6f}" for r in runs.values()))
    for name in BACKENDS:
        losses, _, params = runs[name]
        print(f"{name} against one process: largest difference: losses "
              f"{launch.largest_difference(losses, reference[0]):.3e}, parameters "
              f"{launch.largest_difference(params, reference[2]):.3e}")
    (g_losses, _, g_params), (r_losses, _, r_params) = runs["gloo"], runs["ringcomm"]
    same = g_losses == r_losses and all(torch.equal(a, b) for a, b in zip(g_params, r_params))
    print(f"ringcomm against gloo: {'bitwise identical' if same else 'different'}; largest "
          f"difference: losses {launch.largest_difference(g_losses, r_losses):.3e}, "
          f"parameters {launch.largest_difference(g_params, r_params):.3e}")
    print(f"median step time (slowest rank): gloo {step_s['gloo'] * 1e3:.2f} ms, ringcomm "
          f"{step_s['ringcomm'] * 1e3:.2f} ms ({step_s['ringcomm'] / step_s['gloo']:.2f}x gloo's)")


if __name__ == "__main__":
    arguments = parse_args()
    launch.run(main, arguments, arguments.ranks)
