"""Per-call time of a small all_reduce through ringcomm's layers: the core's own loop (C++ runs
back to back, no Python between them), the Communicator (``comm.all_reduce``) and the torch
backend (``dist.all_reduce`` on a "ringcomm" group). At this size the ring moves a few bytes, so
the time is the call's own path, and the differences are what each layer adds.

    python bench/call_latency.py                          # 2 ranks, 8 bytes of float32
    python bench/call_latency.py --nproc 1 --blocks 200   # one rank: the Python path alone
    python bench/call_latency.py --json r.json            # also write the medians

A third path is the Communicator with its flight record off (``trace_buffer=0``): the
record's cost per call is the first path's time over it. A fourth is ``dist.all_reduce`` on a
group of torch's own C++ backend that does nothing (``fake``, from torch's testing package):
what torch itself costs per call, the floor under any backend's ``dist.all_reduce``.

Spawns --nproc local ranks. The paths run in alternating blocks of --calls calls, so that
machine noise hits them alike; each block's mean per call is one sample, and rank 0 prints the
median and quartiles of the samples of each path.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import ringcomm
except ImportError:  # run from a source checkout: the package sits next to bench/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import ringcomm


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="local ranks")
    p.add_argument("--bytes", type=int, default=8, help="float32 bytes per call")
    p.add_argument("--calls", type=int, default=200, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=50, help="timed blocks per path")
    p.add_argument("--warmup", type=int, default=500, help="untimed calls per path first")
    p.add_argument("--json", metavar="PATH", help="write the medians (us per call) as JSON")
    return p.parse_args(argv)


def _block(call, calls):
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def _core_loop(comm, t):
    """`calls` -> us per call of the same all_reduce run back to back by the core itself
    (_C.Communicator.time_runs): the floor under the Python layers."""
    comm.all_reduce(t)  # sets up the ring
    c_comm = comm._router.communicator_for("cpu", -1)
    request = ringcomm._C.CollectiveRequest(
        ringcomm._C.Collective.all_reduce, t.data_ptr(), 0, t.numel(), ringcomm._C.DataType.float32,
        ringcomm._C.RedOp.sum, 0, comm.default_algorithm("all_reduce"))
    return lambda calls: statistics.fmean(c_comm.time_runs(request, calls)) / 1e3


def _no_op_group():
    """A group of torch's C++ backend that does nothing (``fake``, registered by a module of
    torch's testing package, not part of its API): None, and the row left out, where this torch
    lacks it."""
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  registers "fake"
    except ImportError:
        return None
    return dist.new_group(backend="fake")


def _rank(rank, world_size, init_file, args, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    comm = ringcomm.Communicator(timeout=120)
    unrecorded = ringcomm.Communicator(timeout=120, trace_buffer=0)
    group = dist.new_group(backend="ringcomm")
    no_op = _no_op_group()
    t = torch.ones(max(1, args.bytes // 4))
    untouched = t.clone()
    core = _core_loop(comm, t)
    paths = {"core loop (C++)": None,
             "Communicator.all_reduce": lambda: comm.all_reduce(t),
             "dist.all_reduce (ringcomm group)": lambda: dist.all_reduce(t, group=group),
             "Communicator, trace_buffer=0": lambda: unrecorded.all_reduce(t),
             "dist.all_reduce (no-op C++ backend)": no_op and (
                 lambda: dist.all_reduce(untouched, group=no_op))}
    if no_op is None:
        del paths["dist.all_reduce (no-op C++ backend)"]
    core(args.warmup)
    for call in filter(None, paths.values()):
        for _ in range(args.warmup):
            call()
    samples = {name: [] for name in paths}
    for _ in range(args.blocks):
        for name, call in paths.items():
            samples[name].append(core(args.calls) if call is None else _block(call, args.calls))
    dist.barrier()
    comm.close()
    unrecorded.close()
    dist.destroy_process_group()
    if rank == 0:
        results.update({name: statistics.quantiles(s, n=4) for name, s in samples.items()})


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(args.nproc, os.path.join(folder, "init"), args, results),
                 nprocs=args.nproc)
        results = dict(results)
    print(f"# {args.bytes} B float32 all_reduce, {args.nproc} rank(s); us per call over "
          f"{args.blocks} blocks of {args.calls} calls: median [quartiles]")
    for name, (low, median, high) in results.items():
        print(f"{name:34s} {median:8.2f}  [{low:.2f}, {high:.2f}]")
    on, off = results["Communicator.all_reduce"][1], results["Communicator, trace_buffer=0"][1]
    print(f"flight record's cost: {100 * (on / off - 1):+.1f}% per call")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: q[1] for name, q in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
