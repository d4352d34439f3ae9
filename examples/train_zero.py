"""A ZeRO-1/2 data-parallel step written directly with ringcomm: gradients reduce-scattered,
optimizer state sharded, parameters all-gathered, against plain DDP with the whole optimizer.

Every rank holds the whole model but Adam's state for only 1/N of the parameters (its shard of
one flat vector). Per step: backward; the flat gradient is reduce-scattered with op="avg" (each
rank gets the mean gradient of its shard: ZeRO-2 keeps no full averaged gradient); the rank
updates its shard with Adam; all_gather puts every shard back into every rank's parameters.
That is the same traffic as DDP's all_reduce (reduce-scatter + allgather: a ring all_reduce cut
in two), with the optimizer step in between and on 1/N of the state. The script prints both
runs' losses, their largest difference, the optimizer state per rank and the step times.

    python examples/train_zero.py                     # 2 local CPU ranks
    python examples/train_zero.py --ranks 4 --width 1024
    torchrun --nproc-per-node 2 examples/train_zero.py
"""
import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch  # noqa: E402

import ringcomm  # noqa: E402


def parse_args(argv=None):
    p = launch.arguments(__doc__)
    p.add_argument("--layers", type=int, default=4)
    return p.parse_args(argv)


def adam_state_bytes(opt):
    return sum(t.numel() * t.element_size() for state in opt.state.values()
               for t in state.values() if torch.is_tensor(t) and t.dim() > 0)


class ZeroStep:
    """ZeRO-1/2 for a replicated model over a ringcomm Communicator: rank r owns elements
    [r * shard, (r + 1) * shard) of the parameters flattened into one vector (padded to a
    multiple of the world size), and keeps Adam's state for them alone."""

    def __init__(self, model, comm, lr):
        self.model, self.comm, self.n = model, comm, comm.world_size
        self.numel = sum(p.numel() for p in model.parameters())
        self.shard = -(-self.numel // self.n)
        self.flat_grad = torch.zeros(self.shard * self.n)  # the padding stays zero
        self.flat_params = torch.zeros(self.shard * self.n)
        mine = parameters_to_vector(model.parameters())[comm.rank * self.shard:][:self.shard]
        self.owned = nn.Parameter(torch.zeros(self.shard))
        with torch.no_grad():
            self.owned[:mine.numel()] = mine
        self.owned.grad = torch.zeros(self.shard)
        self.opt = torch.optim.Adam([self.owned], lr=lr)

    def step(self):
        with torch.no_grad():
            self.flat_grad[:self.numel] = parameters_to_vector(p.grad for p in self.model.parameters())
        self.comm.reduce_scatter(self.owned.grad, self.flat_grad, op="avg")
        self.opt.step()
        self.comm.all_gather(self.flat_params, self.owned.detach())
        vector_to_parameters(self.flat_params[:self.numel], self.model.parameters())


def train_zero(args, rank, comm):
    model = launch.mlp(args)
    zero = ZeroStep(model, comm, lr=1e-3)

    def step(i):
        x, y = launch.classification_batch(args, rank, i)
        model.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        zero.step()
        return loss

    losses, times = launch.timed_steps(args, step)
    return losses, times, [p.detach().clone() for p in model.parameters()], \
        adam_state_bytes(zero.opt)


def train_ddp(args, rank):
    model = launch.mlp(args)
    ddp = DDP(model)  # the default gloo group
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)

    def step(i):
        x, y = launch.classification_batch(args, rank, i)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    losses, times = launch.timed_steps(args, step)
    return losses, times, [p.detach().clone() for p in model.parameters()], adam_state_bytes(opt)


def main(rank, world_size, args):
    comm = ringcomm.Communicator(timeout=120)
    runs = {"DDP (gloo), whole Adam": train_ddp(args, rank),
            "ZeRO on ringcomm": train_zero(args, rank, comm)}
    step_s = {name: launch.slowest_median(run[1]) for name, run in runs.items()}
    comm.close()
    if rank == 0:
        report(args, world_size, runs, step_s)


def report(args, world_size, runs, step_s):
    (ddp_name, ddp), (zero_name, zero) = runs.items()
    params = sum(p.numel() for p in ddp[2])
    print(f"ZeRO-1/2 against DDP on {world_size} ranks: MLP {args.layers}x{args.width}, "
          f"{params / 1e6:.2f} M parameters, Adam, {args.steps} steps")
    print(f"{'step':>6}{ddp_name + ' loss':>30}{zero_name + ' loss':>26}")
    for step in sorted({0, args.steps - 1, *range(0, args.steps, max(1, args.steps // 5))}):
        print(f"{step:>6}{ddp[0][step]:>30.6f}{zero[0][step]:>26.6f}")
    same = ddp[0] == zero[0] and all(torch.equal(a, b) for a, b in zip(ddp[2], zero[2]))
    print(f"ZeRO against DDP: {'bitwise identical' if same else 'different'}; largest difference: "
          f"losses {launch.largest_difference(ddp[0], zero[0]):.3e}, parameters "
          f"{launch.largest_difference(ddp[2], zero[2]):.3e}")
    print(f"Adam state per rank: DDP {ddp[3] / 2**20:.2f} MiB, ZeRO {zero[3] / 2**20:.2f} MiB "
          f"({zero[3] / ddp[3]:.2f}x)")
    print(f"median step time (slowest rank): DDP {step_s[ddp_name] * 1e3:.2f} ms, ZeRO "
          f"{step_s[zero_name] * 1e3:.2f} ms ({step_s[zero_name] / step_s[ddp_name]:.2f}x DDP's)")


if __name__ == "__main__":
    arguments = parse_args()
    launch.run(main, arguments, arguments.ranks)
