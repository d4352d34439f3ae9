"""Runs a function on N real local processes joined by torch.distributed (gloo, file store).

The function gets (rank, world_size, *args) and runs after init_process_group; its return
value comes back to the parent. Every exit code is checked; a worker's exception is re-raised in
the parent with the worker's traceback; a run past `timeout` kills every worker and fails.

Workers are forked by default (a fraction of a second each); start_method="spawn" starts fresh
interpreters, which a process that has used CUDA needs (then `fn` must be importable by name)."""
import gc
import multiprocessing
import os
import pickle
import queue
import signal
import tempfile
import threading
import time
import traceback


class WorkerError(AssertionError):
    pass


# After a rank's failure, how long the others may still report (their own failure, often the
# first one's cause) before the launch ends.
FAILURE_GRACE_S = 5.0

# Every worker process started so far, so that a test can tell its own processes' traces (e.g.
# shared-memory names, which carry the creator's pid) from those of other runs on the machine.
started_pids = []


def _worker(fn, rank, world_size, store_path, results, args, env):
    try:
        os.environ.update(env(rank, world_size) if callable(env) else env)
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size)
        try:
            value = fn(rank, world_size, *args)
        finally:
            if dist.is_initialized():  # fn may have destroyed it (a test of life without one)
                dist.destroy_process_group()
        # Plain pickle copies tensors; the queue's own pickler would share their memory with
        # a process that is about to exit.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # report everything, including assertion failures
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1)


def die_soon(store, after=0.05):
    """Kills this worker with SIGKILL `after` seconds from now (from a thread, so mid-call),
    first writing the time to the store's "killed_at"."""
    def kill():
        time.sleep(after)
        store.set("killed_at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=kill, daemon=True).start()


def shared_gpu_env(rank, world_size):
    """Environment that lets the ranks share one GPU, for launch(env=shared_gpu_env):
    ringcomm.transport.cuda.shared_gpu_env (a function that spawn can pickle)."""
    from ringcomm.transport import cuda

    return cuda.shared_gpu_env(rank, world_size)


def launch(world_size, fn, *args, timeout=120, allow_exit=None, start_method="fork", env=None):
    """Runs fn on world_size processes; returns the list of return values by rank.

    allow_exit: ranks whose process may end without reporting (killed on purpose by a test).
    start_method: "fork" or "spawn" (see the module docstring).
    env: environment variables each worker sets before anything else: a dict, or a picklable
    function of the rank and world size that returns one."""
    allow_exit = set(allow_exit or ())
    ctx = multiprocessing.get_context(start_method)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_worker,
                             args=(fn, r, world_size, store_path, results, args, env or {}))
                 for r in range(world_size)]
        try:
            return _collect(procs, results, world_size, allow_exit, timeout)
        finally:  # also when pytest-timeout interrupts the wait: no worker outlives its test
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()


def _collect(procs, results, world_size, allow_exit, timeout):
    """Starts the workers, waits for their reports and checks how they ended. A rank that died
    without reporting (a crash, not an exception) ends the wait at once, and a rank's failure
    FAILURE_GRACE_S later (time for the others' reports): their peers would only wait for them
    until the deadline."""
    # Garbage the parent left (earlier tests' process groups, Works, futures) is collected here,
    # not in the forked children: freeing torch's c10d objects there can crash (their threads
    # and locks do not survive a fork).
    gc.collect()
    for p in procs:
        p.start()
        started_pids.append(p.pid)
    values, failures = {}, []
    deadline = time.monotonic() + timeout
    died, failed_at = [], None
    while len(values) + len(failures) < world_size - len(allow_exit):
        try:
            # At most a second per wait: a report a rank made before it exited is in the queue
            # by then (its feeder thread flushes before the process ends).
            rank, ok, value = results.get(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            if failures and time.monotonic() > failed_at + FAILURE_GRACE_S:
                break
            reported = set(values) | {rank for rank, _ in failures}
            died = [r for r, p in enumerate(procs)
                    if p.exitcode is not None and r not in reported and r not in allow_exit]
            if died or time.monotonic() > deadline:
                break
            continue
        if ok:
            values[rank] = pickle.loads(value)
        else:
            if not failures:
                failed_at = time.monotonic()
            failures.append((rank, value))
    for p in procs:
        p.join(timeout=1.0 if died or failures else max(1.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]  # launch() kills them on return
    if failures:
        rank, trace = sorted(failures)[0]
        raise WorkerError(f"rank {rank} of {world_size} failed:\n{trace}")
    if died:
        codes = ", ".join(f"rank {r} with code {procs[r].exitcode}" for r in died)
        raise WorkerError(f"{codes} of {world_size} exited without reporting"
                          + (f"; ranks {hung} were still running" if hung else ""))
    if hung:
        raise WorkerError(f"ranks {hung} of {world_size} did not finish within {timeout} s")
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0 and r not in allow_exit]
    if bad:
        raise WorkerError(f"worker exit codes (rank, code): {bad}")
    return [values.get(r) for r in range(world_size)]
