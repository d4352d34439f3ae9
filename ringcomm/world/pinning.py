"""Cores for the ranks of one host (the ``pin_cores`` option), as MPI libraries bind theirs.

Two ranks whose calling threads the scheduler puts on one core take turns at it: a small
collective then costs a context switch per hop (~30 us instead of ~4). So when a CPU
communicator sets up, the ranks of each host split the CPUs they may run on into as many
contiguous groups as there are ranks, and the thread that sets it up (the one that calls the
collectives, as a rule), with the threads it starts from then on, keeps to its group: rank i
of L on 2 cores gets core i; on 64 cores, 64 / L cores each. Threads started before (torch's
and gloo's pools, a data loader's) keep their CPUs. Nothing is pinned unless every rank of the
host is its own process with the same CPUs allowed (none was bound by the user or a launcher)
and there is a CPU for each; the process's first communicator decides, later ones leave it.
"""
import os

_before = None  # the CPUs this process was allowed before it was pinned; None: not pinned


def available_cores():
    """The CPUs this process may run on, as they were before ringcomm pinned a thread of it."""
    return set(_before) if _before is not None else os.sched_getaffinity(0)


def pinned():
    """The calling thread's CPUs where ringcomm pinned this process's rank, else None."""
    return os.sched_getaffinity(0) if _before is not None else None


def group(cpus, index, count):
    """The `index`-th of `count` contiguous groups of `cpus` (sizes differ by one at most)."""
    ordered = sorted(cpus)
    start = index * len(ordered) // count
    return set(ordered[start:(index + 1) * len(ordered) // count])


def _compact(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def pin(rendezvous, local_ranks, mode):
    """Every rank of `rendezvous` calls this together (unless `mode` is "off" on all of them);
    `local_ranks`: the ranks on this rank's host. Returns the CPUs the calling thread now keeps
    to, or None where it was not pinned."""
    global _before
    if mode == "off":
        return None
    allowed = os.sched_getaffinity(0)
    rendezvous.publish("cpus", f"{os.getpid()} {int(_before is not None)} {_compact(allowed)}")
    seen = [rendezvous.read("cpus", r).decode().split(" ") for r in local_ranks]
    pids = {pid for pid, _, _ in seen}
    if (len(local_ranks) < 2 or len(pids) < len(local_ranks)  # ranks that are threads
            or any(done == "1" for _, done, _ in seen)  # pinned already
            or len({cpus for _, _, cpus in seen}) > 1  # bound by the user or a launcher
            or len(allowed) < len(local_ranks)):  # more ranks than CPUs: nothing to split
        return None
    mine = group(allowed, local_ranks.index(rendezvous.rank), len(local_ranks))
    os.sched_setaffinity(0, mine)  # the calling thread, and the threads it starts from now on
    _before = allowed
    return mine
