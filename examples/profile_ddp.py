"""A Chrome trace of a few DDP steps on the ringcomm backend: torch.profiler shows every
collective as a range named ringcomm:<call> (DDP's ringcomm:all_reduce of each bucket, its
ringcomm:broadcast at start), with its tensors' shapes and dtype, beside forward and backward.

    python examples/profile_ddp.py                          # 2 local CPU ranks
    python examples/profile_ddp.py --trace ddp_trace.json   # then open it in Perfetto
    torchrun --nproc-per-node 2 examples/profile_ddp.py

Rank 0 writes the trace and prints how many ranges each ringcomm call has in it.
"""
import collections
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
import launch  # noqa: E402

import ringcomm  # noqa: E402, F401  registers the "ringcomm" backend


def main(rank, world_size, args):
    group = dist.new_group(backend="ringcomm")
    model = DDP(launch.mlp(args), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with torch.profiler.profile(record_shapes=True) as prof:
        for i in range(args.steps):
            x, y = launch.classification_batch(args, rank, i)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    if rank == 0:
        prof.export_chrome_trace(args.trace)
        events = json.load(open(args.trace))["traceEvents"]
        calls = collections.Counter(e["name"] for e in events
                                    if e.get("name", "").startswith("ringcomm:"))
        print(f"{args.trace}: {args.steps} DDP steps on {world_size} ranks; ringcomm ranges: "
              + ", ".join(f"{name} x{n}" for name, n in sorted(calls.items())))


if __name__ == "__main__":
    p = launch.arguments(__doc__, width=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--trace", default="ddp_trace.json", help="the Chrome trace rank 0 writes")
    p.set_defaults(steps=5)
    args = p.parse_args()
    launch.run(main, args, args.ranks)
