"""pin_cores: the ranks of a host split its CPUs and each rank's calling thread (with the
threads it starts later) keeps to its share, unless the user or a launcher bound them, ranks
are threads of one process, or there are more ranks than CPUs. Real processes; expectations
follow the CPUs of the host the tests run on."""
import os
import threading

import pytest
import torch

from launcher import launch
from ringcomm.world import pinning

CPUS = os.sched_getaffinity(0)
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="one CPU: nothing to split")


def thread_cpus(tid):
    with open(f"/proc/self/task/{tid}/status") as f:
        line = next(line for line in f if line.startswith("Cpus_allowed_list"))
    return line.split(":")[1].strip()


def listed(cpus):
    """CPUs as the kernel lists them ("0-3,6"), for comparing with thread_cpus."""
    ordered, runs = sorted(cpus), []
    for c in ordered:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def test_groups_split_the_cpus_contiguously_and_evenly():
    assert [pinning.group(range(8), i, 3) for i in range(3)] == [{0, 1}, {2, 3, 4}, {5, 6, 7}]
    assert [pinning.group({5, 1}, i, 2) for i in range(2)] == [{1}, {5}]
    assert pinning.group(range(4), 0, 1) == {0, 1, 2, 3}


def pinned_ranks(rank, n, env_mode):
    import ringcomm

    if env_mode:
        os.environ["RINGCOMM_PIN_CORES"] = env_mode
    ready = threading.Event()
    before = threading.Thread(target=ready.wait)  # a thread the process had already
    before.start()
    comm = ringcomm.Communicator(timeout=60)
    second = ringcomm.Communicator(timeout=60)  # made after pinning: the same options
    after = threading.Thread(target=ready.wait)  # started by the pinned thread
    after.start()
    comm.all_reduce(torch.ones(4))
    result = (sorted(os.sched_getaffinity(0)), thread_cpus(before.native_id),
              thread_cpus(after.native_id), comm.options.spin_us == second.options.spin_us)
    ready.set()
    before.join(), after.join()
    comm.close(), second.close()
    return result


@needs_two
def test_two_ranks_take_disjoint_shares_of_the_cpus_with_the_threads_they_start():
    results = launch(2, pinned_ranks, None)
    shares = [set(cpus) for cpus, _, _, _ in results]
    assert shares == [pinning.group(CPUS, r, 2) for r in range(2)], results
    for cpus, before, after, same_options in results:
        assert before == listed(CPUS) and after == listed(cpus) and same_options, results


def test_off_leaves_the_cpus_as_they_were():
    for cpus, before, after, _ in launch(2, pinned_ranks, "off"):
        assert set(cpus) == CPUS and before == after == listed(CPUS)


def bound_by_the_user(rank, n):
    import ringcomm

    if rank == 1:
        os.sched_setaffinity(0, {min(CPUS)})  # as a launcher binding each rank would
    comm = ringcomm.Communicator(timeout=60)
    comm.all_reduce(torch.ones(4))
    comm.close()
    return sorted(os.sched_getaffinity(0))


@needs_two
def test_ranks_bound_by_the_user_keep_their_cpus():
    assert launch(2, bound_by_the_user) == [sorted(CPUS), [min(CPUS)]]


def test_more_ranks_than_cpus_are_not_pinned():
    n = len(CPUS) + 1
    for cpus, _, _, _ in launch(n, pinned_ranks, None):
        assert set(cpus) == CPUS


def ranks_as_threads(rank, n):
    import torch.distributed as dist

    import ringcomm
    from ringcomm.world.rendezvous import Rendezvous

    store, comms = dist.HashStore(), [None, None]

    def make(r):
        comms[r] = ringcomm.Communicator(Rendezvous.from_store(store, r, 2, 60, name="threads",
                                                               number=0))
    threads = [threading.Thread(target=make, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for comm in comms:
        comm.close()
    return sorted(os.sched_getaffinity(0))


def test_ranks_that_are_threads_of_one_process_are_not_pinned():
    assert launch(1, ranks_as_threads) == [sorted(CPUS)]
