"""Train a small MLP with DDP on CPU: stock DDP (gloo), plain DDP on the "ringcomm" backend and
ringcomm's hooks side by side, then the hooks' accuracy.

Runs N local processes by itself, or under torchrun:

    python examples/train_ddp.py                       # 2 ranks, a few seconds
    python examples/train_ddp.py --ranks 4 --steps 100 --width 1024
    torchrun --nproc-per-node 2 examples/train_ddp.py

Every configuration trains the same model from the same weights on the same data; steps of the
configurations are interleaved (in rotating order) so that machine noise hits them alike. The
table shows the loss as training goes, then the median step time and its ratio to stock DDP.
"DDP on ringcomm" is plain DDP, no hook, on a process group of the "ringcomm" backend: DDP's
reducer launches each bucket's all_reduce asynchronously, the backend queues it on its worker
thread, and backward goes on meanwhile (as on gloo); its losses match stock DDP's bit for bit.

The accuracy part reduces one set of real gradients four ways and compares each with the float64
mean: float32 (allreduce_hook), ringcomm's 16-bit wire with float32 accumulation (bf16_hook,
fp16_hook) and an emulation of torch's bf16/fp16_compress_hook arithmetic (each rank casts its
gradient to 16 bits and divides by the world size, then the ring sums in 16 bits, rounding at
every hop; torch's own hooks need NCCL).
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch  # noqa: E402

import ringcomm  # noqa: E402
import ringcomm.ddp  # noqa: E402
from ringcomm.schedule import schedule  # noqa: E402

HOOKS = ("allreduce_hook", "bf16_hook", "fp16_hook")
WIRE = {"bf16_hook": torch.bfloat16, "fp16_hook": torch.float16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="local processes to start (ignored under torchrun)")
    p.add_argument("--steps", type=int, default=30, help="timed training steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--width", type=int, default=512, help="hidden layer width")
    p.add_argument("--layers", type=int, default=4, help="hidden layers")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--bucket-cap-mb", type=float, default=1.0, help="DDP bucket size")
    p.add_argument("--hooks", default=",".join(HOOKS),
                   help="comma-separated ringcomm hooks to run; NAME:sync reduces CPU buckets "
                        "inside the hook instead of on the worker thread (no overlap)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (default: cores / ranks, at least 1)")
    return p.parse_args(argv)


def make_model(args, seed=0):
    torch.manual_seed(seed)
    layers, width = [nn.Linear(64, args.width), nn.ReLU()], args.width
    for _ in range(args.layers - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def make_data(args, rank, steps):
    """Synthetic classification: labels from a fixed random teacher, different samples per rank."""
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(64, 10, generator=g)
    g.manual_seed(rank + 1)
    xs = torch.randn(steps, args.batch, 64, generator=g)
    return [(x, (x @ teacher).argmax(1)) for x in xs]


# -- training ------------------------------------------------------------------------------------

BACKEND = "DDP on ringcomm"


def train(args, rank, world_size, hooks, comm, ringcomm_group):
    """Steps every configuration in turn; returns {name: (losses, step times)} on this rank."""
    states = {"": ringcomm.ddp.HookState(comm), "sync": ringcomm.ddp.HookState(comm, async_cpu=False)}
    runs = {}
    for name in ("stock DDP", BACKEND) + hooks:
        model = make_model(args)
        group = ringcomm_group if name == BACKEND else None
        ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb, process_group=group)
        if name not in ("stock DDP", BACKEND):
            hook, _, mode = name.partition(":")
            ddp.register_comm_hook(states[mode], getattr(ringcomm.ddp, hook))
        runs[name] = (ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3), [], [])
    total = args.warmup + args.steps
    data = make_data(args, rank, total)
    names = list(runs)
    for step, (x, y) in enumerate(data):
        for k in range(len(names)):  # rotate the order so no configuration always goes first
            ddp, opt, losses, times = runs[names[(step + k) % len(names)]]
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
            losses.append(loss.item())
    return {name: (losses, times) for name, (_, _, losses, times) in runs.items()}


# -- accuracy ------------------------------------------------------------------------------------


def torch_compress_hook_emulated(per_rank, dtype):
    """What torch's bf16/fp16_compress_hook compute: each rank casts its gradient to ``dtype``
    and divides by the world size in 16 bits, then the ring sums in 16 bits, rounding at every
    hop (chunk c starts at rank c+1 and ends at rank c). ``per_rank``: (world_size, n)."""
    n_ranks, n = per_rank.shape
    parts = per_rank.to(dtype).div_(n_ranks)
    out = torch.empty(n, dtype=dtype)
    for c, (offset, count) in enumerate(schedule("all_reduce", n_ranks, n).chunks):
        span = slice(offset, offset + count)
        acc = parts[(c + 1) % n_ranks, span].clone()
        for k in range(2, n_ranks + 1):
            acc = acc + parts[(c + k) % n_ranks, span]
        out[span] = acc
    return out.float()


def accuracy(args, rank, world_size, comm):
    """{method: (max abs error, relative L2 error)} of averaged real gradients vs float64."""
    model = make_model(args)
    x, y = make_data(args, rank, 1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grad) for _ in range(world_size)]
    dist.all_gather(gathered, grad)
    stacked = torch.stack(gathered)
    reference = stacked.double().mean(0)

    results = {}
    candidates = {"allreduce_hook (float32 wire)": {}}
    candidates.update({f"{name} (ringcomm)": {"wire_dtype": dt} for name, dt in WIRE.items()})
    for label, options in candidates.items():
        results[label] = comm.all_reduce(grad.clone(), op="avg", **options)
    for name, dt in WIRE.items():
        results[f"torch {name.replace('_hook', '_compress_hook')} (emulated)"] = \
            torch_compress_hook_emulated(stacked, dt)
    errors = {}
    for label, result in results.items():
        err = (result.double() - reference).abs()
        errors[label] = (err.max().item(), (err.norm() / reference.norm()).item())
    return errors, grad.numel()


# -- one rank ------------------------------------------------------------------------------------

def run(rank, world_size, args):
    threads = args.threads or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(threads)
    hooks = tuple(h for h in args.hooks.split(",") if h)
    for h in hooks:
        hook, _, mode = h.partition(":")
        if hook not in HOOKS or mode not in ("", "sync"):
            raise SystemExit(f"unknown hook {h!r}; choose from {', '.join(HOOKS)} (or NAME:sync)")

    comm = ringcomm.Communicator(timeout=120)
    ringcomm_group = dist.new_group(backend="ringcomm")
    runs = train(args, rank, world_size, hooks, comm, ringcomm_group)
    errors, numel = accuracy(args, rank, world_size, comm)
    # Step times: the slowest rank's median is the step time of the job.
    medians = {name: statistics.median(times) for name, (_, times) in runs.items()}
    all_medians = [None] * world_size
    dist.all_gather_object(all_medians, medians)
    comm.close()
    if rank == 0:
        report(args, world_size, threads, runs, all_medians, errors, numel)


def report(args, world_size, threads, runs, all_medians, errors, numel):
    names = list(runs)
    params = sum(p.numel() for p in make_model(args).parameters())
    print(f"{world_size} ranks x {threads} thread(s), MLP {args.layers}x{args.width} "
          f"({params / 1e6:.2f} M parameters, {params * 4 / 2**20:.1f} MiB of float32 gradients), "
          f"batch {args.batch}/rank, buckets of {args.bucket_cap_mb} MB, "
          f"{args.warmup} + {args.steps} steps")
    width = max(16, *(len(n) + 2 for n in names))
    print("\nloss (rank 0)")
    print("step".rjust(6) + "".join(n.rjust(width) for n in names))
    total = len(runs[names[0]][0])
    shown = sorted({0, total - 1, *range(0, total, max(1, total // 6))})
    for step in shown:
        print(f"{step:>6}" + "".join(f"{runs[n][0][step]:{width}.6f}" for n in names))
    step_ms = {n: 1e3 * max(m[n] for m in all_medians) for n in names}
    print("\nmedian step time (slowest rank)")
    print("ms".rjust(6) + "".join(f"{step_ms[n]:{width}.2f}" for n in names))
    print("ratio".rjust(6) + "".join(f"{step_ms[n] / step_ms[names[0]]:{width}.3f}" for n in names))
    stock = runs[names[0]][0]
    same = runs[BACKEND][0] == stock
    print(f"\n{BACKEND} against stock DDP: losses {'bitwise identical' if same else 'differ'}, "
          f"largest difference {max(abs(a - b) for a, b in zip(runs[BACKEND][0], stock)):.3e}")

    print(f"\ngradient error vs the float64 mean over {world_size} ranks ({numel} values)")
    label_width = max(len(k) for k in errors) + 2
    print("method".ljust(label_width) + "max abs".rjust(12) + "relative L2".rjust(14))
    for label, (max_abs, rel) in errors.items():
        print(label.ljust(label_width) + f"{max_abs:12.3e}{rel:14.3e}")


if __name__ == "__main__":
    arguments = parse_args()
    launch.run(run, arguments, arguments.ranks)
