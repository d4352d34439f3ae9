"""One rank of the multi-host tests (tests/test_multihost.py), started by torchrun on each
emulated host. Prints one line "RESULT <json>" at the end.

    sweep      every collective x dtype x op x awkward count against exact references (and blocks
               big enough for several pieces), numpy,
               point-to-point round the world and an all_to_all, what the communicator saw of
               its hosts, and the bytes each rank sent to every other rank
    blocks     reduce_scatter and all_gather (in and out of place) x op x awkward count, exact, and
               blocks big enough for several pieces; the bytes each rank sent to every other
    ddp        a few DDP steps on the "ringcomm" torch backend, against a single-process replay
    doubling   all_reduce with algorithm=recursive_doubling (and the ring beside it) x dtype x op
               x awkward count against exact references, and bitwise alike on every rank;
               reduce_scatter and all_gather with it, exact
    failure    all_reduce in a loop until something fails: the error, its kind, and when
               (MULTIHOST_ALGORITHM: the algorithm it runs, MULTIHOST_COUNT: its elements,
               MULTIHOST_COLLECTIVE: reduce_scatter or all_gather instead)
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ringcomm  # noqa: E402
from collective_checks import VALID, Checker, counts_for, one_dtype_per_op  # noqa: E402
from sweep import reduce_reference  # noqa: E402

TIMEOUT = float(os.environ.get("MULTIHOST_TIMEOUT", "60"))


def sweep(comm):
    checker = Checker(comm)
    n = comm.world_size
    for count in counts_for(n) + [100_003]:
        cases = VALID if count < 10_000 else [(torch.float32, "sum"), (torch.float32, "avg"),
                                              (torch.int64, "max")]
        for dtype, op in cases:
            checker.reductions(count, dtype, op)
        checker.copies(count, torch.int32 if count < 10_000 else torch.float32)
    # Blocks of 3 MiB in all (and 5 elements more): two-level reduce_scatter and all_gather in
    # several pieces, the last of 5 elements per block.
    big = (3 << 20) // n + 5
    checker.reductions(big, torch.float32, "avg")
    checker.copies(big, torch.int32)
    checker.numpy_arrays()
    # Point-to-point round the world: each rank sends to the next and receives from the one
    # before (across hosts for some pairs, inside a host for others).
    r = comm.rank
    out, got = torch.arange(1000, dtype=torch.float32) + r, torch.empty(1000)
    comm.batch_isend_irecv([ringcomm.P2POp("send", out, (r + 1) % n),
                            ringcomm.P2POp("recv", got, (r - 1) % n)])
    checker.check("send/recv round the world", got, torch.arange(1000, dtype=torch.float32) + (r - 1) % n)
    if r % 2 == 0 and r + 1 < n:
        comm.send(torch.full((5,), float(r)), dst=r + 1)
    elif r % 2 == 1:
        t = torch.empty(5)
        comm.recv(t, src=r - 1)
        checker.check("send/recv pair", t, torch.full((5,), float(r - 1)))
    sent = torch.arange(3 * n, dtype=torch.int64) + 100 * r
    received = torch.empty(3 * n, dtype=torch.int64)
    comm.all_to_all(received, sent)
    expected = torch.cat([torch.arange(3 * r, 3 * r + 3, dtype=torch.int64) + 100 * q for q in range(n)])
    checker.check("all_to_all_single", received, expected)
    sent = bytes_sent(comm, [("all_reduce", lambda: comm.all_reduce(torch.ones(1 << 16)))]
                      + block_calls(comm))
    return {"failures": checker.failures, "cases": checker.cases, "bytes_sent": sent}


def block_calls(comm):
    """(name, call) of a reduce_scatter and an all_gather of 64 KiB blocks."""
    n = comm.world_size
    return [("reduce_scatter", lambda: comm.reduce_scatter(torch.empty(1 << 14), torch.ones(n << 14))),
            ("all_gather", lambda: comm.all_gather(torch.empty(n << 14), torch.ones(1 << 14)))]


def bytes_sent(comm, calls):
    """{name: bytes this rank sent in call()} for each (name, call), the stats reset before each."""
    sent = {}
    for name, call in calls:
        comm.reset_stats()
        call()
        sent[name] = comm.stats().bytes_sent
    return sent


def doubling(comm):
    """recursive_doubling between hosts: exact for every dtype x op x awkward count (0, 1, fewer
    than ranks, primes, several messages), equal to the ring's result, and the same on every
    rank (a gather of each result compared); reduce_scatter and all_gather exact."""
    checker = Checker(comm)
    n = comm.world_size
    counts = sorted(set(counts_for(n)) | {2, 3, 13, 4099, 100_003})
    checker.scatter_gather_sweep(counts, one_dtype_per_op(), "recursive_doubling")
    for count in counts:
        cases = VALID if count < 10_000 else [(torch.float32, "sum"), (torch.float32, "avg"),
                                              (torch.int64, "max")]
        for dtype, op in cases:
            want = reduce_reference(n, count, op, dtype)
            for algorithm in ("recursive_doubling", "ring"):
                t = checker.input(comm.rank, count, op, dtype)
                comm.all_reduce(t, op=op, algorithm=algorithm)
                checker.check(f"all_reduce {algorithm} {dtype} {op} count {count}", t, want)
                if dtype.is_floating_point and count > 0:
                    every = torch.empty(n * count, dtype=dtype)
                    comm.all_gather(every, t)
                    alike = all(torch.equal(every[q * count:(q + 1) * count].view(torch.uint8),
                                            t.view(torch.uint8)) for q in range(n))
                    checker.check(f"all ranks alike {algorithm} {dtype} {op} count {count}",
                                  torch.tensor([alike]), torch.tensor([True]))
    return {"failures": checker.failures, "cases": checker.cases}


def blocks(comm):
    """reduce_scatter and all_gather, exact (on uneven hosts through their leaders when
    uneven_leaders=on): awkward counts, every op, several pieces."""
    checker = Checker(comm)
    n = comm.world_size
    counts = sorted(set(counts_for(n)) | {2, 3, 13, 4099, 100_003})
    checker.scatter_gather_sweep(counts, VALID, None)
    big = (3 << 20) // n + 5  # several pieces, the last of 5 elements per block
    for op in ("sum", "avg", "max"):
        checker.reduce_scatters(big, torch.float32, op)
    checker.all_gathers(big, torch.int32)
    return {"failures": checker.failures, "cases": checker.cases,
            "bytes_sent": bytes_sent(comm, block_calls(comm))}


def ddp(_comm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    reference = [p.detach().clone() for p in model.parameters()]
    group = dist.new_group(backend="ringcomm")
    wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    rank, n = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        x = torch.full((8, 16), float(rank + step))  # integer-valued: sums are exact
        optimizer.zero_grad()
        wrapped(x).sum().backward()
        optimizer.step()
    # The same steps on one process: the mean of every rank's gradient.
    replay = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p, q in zip(replay.parameters(), reference):
            p.copy_(q)
    opt = torch.optim.SGD(replay.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        grads = []
        for r in range(n):
            replay.zero_grad()
            replay(torch.full((8, 16), float(r + step))).sum().backward()
            grads.append([p.grad.clone() for p in replay.parameters()])
        for i, p in enumerate(replay.parameters()):
            p.grad = sum(g[i] for g in grads) / n
        opt.step()
    # Sums in another order round differently: compare relative to the parameters' size.
    diff = max(((a - b).abs().max() / b.abs().max()).item()
               for a, b in zip(model.parameters(), replay.parameters()))
    return {"relative_difference": diff}


def failure(comm):
    count = int(os.environ.get("MULTIHOST_COUNT", 1 << 20))
    algorithm = os.environ.get("MULTIHOST_ALGORITHM")
    t, every = torch.ones(count), torch.ones(comm.world_size * count)
    call = {"all_reduce": lambda: comm.all_reduce(t, algorithm=algorithm),
            "reduce_scatter": lambda: comm.reduce_scatter(t, every, algorithm=algorithm),
            "all_gather": lambda: comm.all_gather(every, t, algorithm=algorithm),
            }[os.environ.get("MULTIHOST_COLLECTIVE", "all_reduce")]
    steps, started = 0, time.monotonic()
    try:
        while time.monotonic() - started < 4 * TIMEOUT:
            call()
            steps += 1
            if os.environ.get("MULTIHOST_READY") and steps == 20:
                open(os.environ["MULTIHOST_READY"] + f".{comm.rank}", "w").close()
    except ringcomm.RingcommError as error:
        return {"kind": type(error).__name__, "message": str(error), "steps": steps,
                "failed_at": time.time()}
    return {"kind": None, "steps": steps}


def main():
    mode = sys.argv[1]
    dist.init_process_group("gloo")
    comm = ringcomm.Communicator(timeout=TIMEOUT)
    result = {"rank": comm.rank, "host": os.uname().nodename}
    result.update({"sweep": sweep, "doubling": doubling, "blocks": blocks, "ddp": ddp, "failure": failure}[mode](comm))
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())  # one write: lines never mix
    sys.stderr.write(f"rank {comm.rank}: closing\n")
    comm.close()
    sys.stderr.write(f"rank {comm.rank}: closed\n")
    if mode != "failure":
        dist.destroy_process_group()
    sys.stderr.write(f"rank {comm.rank}: exiting\n")


if __name__ == "__main__":
    main()
