"""Ranks for tests/test_reconfigure.py: real processes whose default process group is made with
``enable_reconfigure=True`` (torch 2.14's fault-tolerance API) on a FileStore of their own.

:func:`launch` forks the ranks (a fraction of a second: the parent has imported torch already),
runs ``fn(Rank)`` on each and returns their return values by original rank, with
tests/support/launcher.py's checks (a rank's exception re-raised with its traceback, a rank
that dies or hangs reported). Every launch has its own store, so a handle from one launch is a
handle from another group for the next."""
import multiprocessing
import os
import pickle
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import launcher

HAS_RECONFIGURE = hasattr(dist, "_reconfigure")
GROUP_TIMEOUT = timedelta(seconds=30)


class Rank:
    """One process's view: its original rank, the store every launch rank shares, and the
    steps the scenarios are written in."""

    def __init__(self, rank, world_size, store):
        self.rank, self.world_size, self.store = rank, world_size, store

    def handle(self):
        return dist._get_reconfigure_handle()

    def handles(self, key, ranks=None):
        """The current handles of `ranks` (original ranks; all by default), in that order:
        a barrier among them, every one of them must call it."""
        self.store.set(f"{key}/{self.rank}", self.handle())
        ranks = range(self.world_size) if ranks is None else ranks
        return [self.store.get(f"{key}/{r}").decode() for r in ranks]

    def barrier(self, key):
        self.store.set(f"{key}/{self.rank}", "1")
        for r in range(self.world_size):
            self.store.get(f"{key}/{r}")

    def reconfigure(self, uuid, handles, timeout=30.0):
        dist._reconfigure(uuid, handles, timeout=timedelta(seconds=timeout)).wait()

    def where(self):
        """(rank, world size) as torch.distributed reports them now."""
        return dist.get_rank(), dist.get_world_size()

    def all_reduce(self):
        """The sum of (new rank + 1) over the group, as every element of an int64 tensor sees
        it: [n(n+1)/2] * 4 if every element agrees, else the whole list."""
        tensor = torch.full((4,), dist.get_rank() + 1, dtype=torch.int64)
        dist.all_reduce(tensor)
        values = tensor.tolist()
        return values[0] if len(set(values)) == 1 else values

    def backend_impl(self):
        return dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))


def refused(call):
    """(exception type name, message, seconds, whether a RuntimeError) of `call()`'s failure;
    None if it returned."""
    start = time.monotonic()
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the test looks at what was raised
        return type(e).__name__, str(e), time.monotonic() - start, isinstance(e, RuntimeError)
    return None


def value_or_error(call):
    """call()'s value, or "<exception type>: <message>" if it raised."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _worker(fn, rank, world_size, backend, store_path, results):
    try:
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=GROUP_TIMEOUT, enable_reconfigure=True)
        try:
            value = fn(Rank(rank, world_size, store))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # report everything, including assertion failures
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1)


def launch(backend, fn, world_size=3, timeout=90, allow_exit=()):
    """Runs fn(Rank) on world_size forked processes on `backend` (any init_process_group
    backend string); returns fn's values by original rank (None for a rank in `allow_exit`
    that ended its process without reporting)."""
    if "ringcomm" in backend:
        import ringcomm  # noqa: F401  registers the backend before the fork
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker,
                             args=(fn, r, world_size, backend, store_path, results))
                 for r in range(world_size)]
        try:
            return launcher._collect(procs, results, world_size, set(allow_exit), timeout)
        finally:  # no rank outlives its test
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
