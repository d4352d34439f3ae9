"""A torchrun job for tests/test_emulated_hosts.py: gloo over the emulated hosts' network.

Each rank writes a file in its /dev/shm, then prints one JSON line: its rank, hostname, the job's
files it sees in /dev/shm, and an all_reduce's result. With --loop MARKER it then creates MARKER
(rank 0) and keeps all-reducing for up to a minute (for tests that cut a link meanwhile)."""
import argparse
import datetime
import json
import os
import socket
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--loop", help="file rank 0 creates once the job runs; then all_reduce in a loop")
p.add_argument("--timeout", type=float, default=60, help="gloo's timeout (seconds)")
args = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
rank, world = dist.get_rank(), dist.get_world_size()
mine = f"/dev/shm/emulated-hosts-job-{rank}"
with open(mine, "w") as f:
    f.write(str(rank))
dist.barrier()
seen = sorted(e for e in os.listdir("/dev/shm") if e.startswith("emulated-hosts-job-"))
t = torch.arange(16, dtype=torch.int64) + (rank + 1) * 10**12  # short lines: no interleaving
dist.all_reduce(t)
report = {"rank": rank, "local_rank": int(os.environ["LOCAL_RANK"]),
          "hostname": socket.gethostname(), "shm": seen, "sum": t.tolist()}
os.write(1, (json.dumps(report) + "\n").encode())  # one write: ranks' lines never interleave
dist.barrier()
os.unlink(mine)
if args.loop:
    if rank == 0:
        open(args.loop, "w").close()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        dist.all_reduce(torch.ones(1000))
dist.destroy_process_group()
