"""FSDP2 (``fully_shard``, the ZeRO-3 pattern: parameters, gradients and optimizer state sharded
across ranks) trained on the "ringcomm" backend and on gloo, side by side.

Each backend trains the same MLP from the same weights on the same data; FSDP2 all-gathers each
layer's parameters before its forward and backward and reduce-scatters its gradients, all on the
backend's process group. The script prints both runs' losses, the largest difference between
them (losses and final parameters), and the median step time of each.

    python examples/train_fsdp.py                     # 2 local CPU ranks
    python examples/train_fsdp.py --ranks 4 --width 1024 --steps 30
    torchrun --nproc-per-node 2 examples/train_fsdp.py
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch  # noqa: E402

import ringcomm  # noqa: E402,F401  registers the "ringcomm" backend

BACKENDS = ("gloo", "ringcomm")


def parse_args(argv=None):
    p = launch.arguments(__doc__)
    p.add_argument("--layers", type=int, default=4)
    return p.parse_args(argv)


def train(args, rank, group):
    """FSDP2 over `group`: (losses, step times, full parameters at the end)."""
    mesh = DeviceMesh.from_group(group, "cpu")
    model = launch.mlp(args)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i):
        x, y = launch.classification_batch(args, rank, i)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    losses, times = launch.timed_steps(args, step)
    return losses, times, [p.full_tensor() for p in model.parameters()]


def main(rank, world_size, args):
    runs = {}
    for backend in BACKENDS:
        group = dist.new_group(backend=backend)
        runs[backend] = train(args, rank, group)
    step_s = {b: launch.slowest_median(runs[b][1]) for b in BACKENDS}
    if rank == 0:
        report(args, world_size, runs, step_s)


def report(args, world_size, runs, step_s):
    (gloo_losses, _, gloo_params), (rc_losses, _, rc_params) = runs["gloo"], runs["ringcomm"]
    print(f"FSDP2 on {world_size} ranks: MLP {args.layers}x{args.width}, "
          f"{sum(p.numel() for p in gloo_params) / 1e6:.2f} M parameters, {args.steps} steps")
    print(f"{'step':>6}{'gloo loss':>14}{'ringcomm loss':>16}")
    for step in sorted({0, args.steps - 1, *range(0, args.steps, max(1, args.steps // 5))}):
        print(f"{step:>6}{gloo_losses[step]:>14.6f}{rc_losses[step]:>16.6f}")
    same = gloo_losses == rc_losses and all(torch.equal(a, b) for a, b in zip(gloo_params, rc_params))
    print(f"ringcomm against gloo: {'bitwise identical' if same else 'different'}; largest "
          f"difference: losses {launch.largest_difference(gloo_losses, rc_losses):.3e}, "
          f"parameters {launch.largest_difference(gloo_params, rc_params):.3e}")
    print(f"median step time (slowest rank): gloo {step_s['gloo'] * 1e3:.2f} ms, ringcomm "
          f"{step_s['ringcomm'] * 1e3:.2f} ms ({step_s['ringcomm'] / step_s['gloo']:.2f}x gloo's)")


if __name__ == "__main__":
    arguments = parse_args()
    launch.run(main, arguments, arguments.ranks)
