"""torch 2.14's reconfigure (fault-tolerance) API on the ringcomm backend, gloo beside it as the
baseline: ``init_process_group(..., enable_reconfigure=True)``, ``dist._get_reconfigure_handle``
and ``dist._reconfigure(uuid, handles)``, which (re)builds the group from the handles given.

The scenarios are those of torch's own conformance tests (test/distributed/
test_c10d_fault_tolerance.py: 3 ranks on CPU), written here with exact integer results; then
the failures a fault-tolerant job meets: a reused uuid, a handle from another group, a member
that never arrives or has died (an error within the timeout, not a hang, after which the group
can still be rebuilt), collectives before the first reconfigure.

Each test forks 3 ranks on a FileStore of their own (tests/support/reconfigure_job.py); ``r.rank``
is a rank's original rank, and handles are gathered through the store in that order. A list of
handles numbers the ranks by position; a set, by the handles' sorted order."""
import os

import pytest
import torch
import torch.distributed as dist

from launcher import WorkerError
from reconfigure_job import HAS_RECONFIGURE, launch, refused, value_or_error

pytestmark = pytest.mark.skipif(
    not HAS_RECONFIGURE,
    reason=f"torch {torch.__version__} has no dist._reconfigure (the API came in torch 2.14)")

BACKENDS = pytest.mark.parametrize("backend", ["gloo", "ringcomm"])
WORLD = 3
FULL = 1 + 2 + 3  # Rank.all_reduce: the sum of (rank + 1) over 3 ranks
TIMEOUT = 0.5  # seconds, for the reconfigures that must fail
SLACK = 5.0  # how much later than TIMEOUT such a failure may come (FileStore waits ~1 s more)


def configured(r, uuid, key="init"):
    """All 3 ranks in one group in their original order; returns the handles after it."""
    r.reconfigure(uuid, r.handles(key))
    return r.handles(f"{key}/after")


def assert_refused(failure, within, words=()):
    """`failure` (reconfigure_job.refused's value) is a RuntimeError (as torch's own tests expect
    of every backend) raised within `within` seconds whose message has every word of `words`."""
    assert failure is not None, "the call returned instead of raising"
    kind, message, seconds, runtime_error = failure
    assert runtime_error, f"{kind}, not a RuntimeError: {message}"
    assert seconds <= within, f"raised after {seconds:.1f} s (limit {within:.1f} s): {message}"
    for word in words:
        assert word in message.lower(), f"{word!r} not in the message: {message}"


@BACKENDS
def test_basic(backend):
    def scenario(r):
        supports = dist._supports_reconfigure(), r.backend_impl().supports_reconfigure
        handle = r.handle()
        r.reconfigure(100, r.handles("init"))
        return supports, handle, r.where(), r.all_reduce()

    got = launch(backend, scenario)
    for rank, (supports, handle, where, total) in enumerate(got):
        assert supports == (True, True)
        assert isinstance(handle, str) and handle.startswith(f"{backend}:"), handle
        assert where == (rank, WORLD)
        assert total == FULL
    assert len({handle for _, handle, _, _ in got}) == WORLD, "two ranks gave the same handle"


@BACKENDS
def test_handle_order_sets_ranks(backend):
    """A list in reverse order reverses the ranks; a set numbers them in sorted order."""
    def scenario(r):
        r.reconfigure(150, r.handles("init")[::-1])
        reversed_ = r.where(), r.all_reduce()
        handles, mine = r.handles("again"), r.handle()
        r.reconfigure(151, set(handles))
        return reversed_, sorted(handles).index(mine), r.where(), r.all_reduce()

    for rank, (reversed_, sorted_index, where, total) in enumerate(launch(backend, scenario)):
        assert reversed_ == ((WORLD - 1 - rank, WORLD), FULL)
        assert (where, total) == ((sorted_index, WORLD), FULL)


@BACKENDS
def test_send_recv_after_reconfigure(backend):
    """A ring of isend/irecv in the new numbering (the ranks reversed)."""
    def scenario(r):
        r.reconfigure(300, r.handles("init")[::-1])
        rank = dist.get_rank()
        to, source = (rank + 1) % WORLD, (rank - 1) % WORLD
        out = torch.full((4,), rank + 1, dtype=torch.int64)
        into = torch.zeros(4, dtype=torch.int64)
        works = [dist.isend(out, to), dist.irecv(into, source)]
        for work in works if rank % 2 == 0 else works[::-1]:
            work.wait()
        return rank, into.tolist()

    for rank, (new_rank, received) in enumerate(launch(backend, scenario)):
        assert new_rank == WORLD - 1 - rank
        assert received == [(new_rank - 1) % WORLD + 1] * 4


@BACKENDS
@pytest.mark.parametrize("excluded", [2, 1], ids=["last", "middle"])
def test_shrink(backend, excluded):
    def scenario(r):
        handles = configured(r, 400)
        if r.rank == excluded:
            r.barrier("done")
            return None
        r.reconfigure(401, [h for i, h in enumerate(handles) if i != excluded])
        where, total = r.where(), r.all_reduce()
        tensor = torch.full((4,), 42 if dist.get_rank() == 0 else 0, dtype=torch.int64)
        dist.broadcast(tensor, group_src=0)
        r.barrier("done")
        return where, total, tensor.tolist()

    got = launch(backend, scenario)
    survivors = [rank for rank in range(WORLD) if rank != excluded]
    assert got[excluded] is None
    for new_rank, rank in enumerate(survivors):
        assert got[rank] == ((new_rank, 2), 1 + 2, [42] * 4), rank


@BACKENDS
def test_scale_down_and_up(backend):
    """Every rank alone (each its own uuid), all together, alone again: torch's scale down/up
    and single-to-all scenarios."""
    def scenario(r):
        seen = []
        r.reconfigure(600 + r.rank, [r.handle()])
        seen.append((r.where(), r.all_reduce()))
        r.reconfigure(603, r.handles("all"))
        seen.append((r.where(), r.all_reduce()))
        r.reconfigure(604 + r.rank, [r.handle()])
        seen.append((r.where(), r.all_reduce()))
        r.barrier("done")
        return seen

    for rank, seen in enumerate(launch(backend, scenario)):
        assert seen == [((0, 1), 1), ((rank, WORLD), FULL), ((0, 1), 1)]


@BACKENDS
def test_identity(backend):
    """The same members again, a few times, each straight after a collective (the handles are
    gathered before it): a rank that has finished it must not fail its peers' by moving on."""
    def scenario(r):
        handles, seen = r.handles("init"), []
        for uuid in range(800, 804):
            r.reconfigure(uuid, handles)
            handles = r.handles(f"after {uuid}")
            seen.append((r.where(), value_or_error(r.all_reduce)))
        return seen

    for rank, seen in enumerate(launch(backend, scenario)):
        assert seen == [((rank, WORLD), FULL)] * 4


@BACKENDS
def test_late_join(backend):
    """Rank 0 works alone; ranks 1 and 2, never configured until then, join it."""
    def scenario(r):
        alone = None
        handles = r.handles("init")
        if r.rank == 0:
            r.reconfigure(900, handles[:1])
            alone = r.where(), r.all_reduce()
        r.reconfigure(901, r.handles("all"))
        return alone, r.where(), r.all_reduce()

    got = launch(backend, scenario)
    assert got[0][0] == ((0, 1), 1)
    for rank, (_, where, total) in enumerate(got):
        assert (where, total) == ((rank, WORLD), FULL)


@BACKENDS
def test_split_then_merge(backend):
    def scenario(r):
        handles = r.handles("init")
        if r.rank == 0:
            r.reconfigure(1000, handles[:1])
        else:
            r.reconfigure(1001, handles[1:])
        split = r.where(), r.all_reduce()
        r.reconfigure(1002, r.handles("all"))
        return split, r.where(), r.all_reduce()

    got = launch(backend, scenario)
    assert [split for split, _, _ in got] == [((0, 1), 1), ((0, 2), 3), ((1, 2), 3)]
    for rank, (_, where, total) in enumerate(got):
        assert (where, total) == ((rank, WORLD), FULL)


@BACKENDS
def test_reconfigure_after_abort(backend):
    def scenario(r):
        configured(r, 1200)
        r.backend_impl().abort()
        error = r.backend_impl().get_error()
        r.reconfigure(1201, r.handles("recover"))
        return error == torch._C._distributed_c10d.ErrorType.SUCCESS, r.all_reduce()

    assert launch(backend, scenario) == [(True, FULL)] * WORLD


@BACKENDS
def test_rejects_reused_uuid(backend):
    """A uuid used before is refused: alone again, or alone after two ranks used it together.
    gloo keeps the group it had; ringcomm aborts it first (its peers are reconfiguring too), so
    a call on it fails instead of hanging. Then the three rebuild the group."""
    def scenario(r):
        reuse = lambda uuid: refused(lambda: r.reconfigure(uuid, [r.handle()]))  # noqa: E731
        r.reconfigure(1100 + r.rank, [r.handle()])
        alone = reuse(1100 + r.rank), value_or_error(r.all_reduce)
        handles, pair = r.handles("pair"), None
        if r.rank < 2:  # ranks 0 and 1 use 1110 together, then rank 0 tries it alone
            r.reconfigure(1110, handles[:2])
            refusal = reuse(1110) if r.rank == 0 else None
            pair = refusal, value_or_error(r.all_reduce)
        r.reconfigure(1120, r.handles("recover"))
        return alone, pair, r.all_reduce()

    got = launch(backend, scenario)
    keeps_group = backend == "gloo"
    for rank, (alone, pair, total) in enumerate(got):
        assert_refused(alone[0], TIMEOUT, ["uuid"])
        assert (alone[1] == 1) if keeps_group else isinstance(alone[1], str), alone[1]
        if rank < 2:
            assert (pair[1] == 3) if keeps_group else isinstance(pair[1], str), pair[1]
        assert total == FULL
    assert_refused(got[0][1][0], TIMEOUT, ["uuid"])


@BACKENDS
def test_rejects_handle_from_another_group(backend):
    """A handle of another launch's group (another store) and a string that is no handle are
    refused; the group is rebuilt afterwards."""
    foreign = launch(backend, lambda r: configured(r, 9000)[2])[0]

    def scenario(r):
        handles = configured(r, 1300)
        not_a_handle = refused(lambda: r.reconfigure(1301, [handles[r.rank], "not a handle"],
                                                     timeout=TIMEOUT))
        r.barrier("tried")
        handles, other_group = r.handles("again"), None
        if r.rank < 2:
            other_group = refused(lambda: r.reconfigure(1302, handles[:2] + [foreign],
                                                        timeout=TIMEOUT))
        r.barrier("tried again")
        r.reconfigure(1303, r.handles("recover"))
        return not_a_handle, other_group, r.where(), r.all_reduce()

    got = launch(backend, scenario)
    for rank, (not_a_handle, other_group, where, total) in enumerate(got):
        assert_refused(not_a_handle, TIMEOUT + SLACK)
        if rank < 2:
            assert_refused(other_group, TIMEOUT + SLACK)
        assert (where, total) == ((rank, WORLD), FULL)


@BACKENDS
def test_member_never_arrives(backend):
    """Ranks 0 and 1 name rank 2, which never calls reconfigure: an error within the timeout
    (not a hang), and then the three rebuild the group."""
    def scenario(r):
        handles = configured(r, 1400)
        failure = None
        if r.rank < 2:
            failure = refused(lambda: r.reconfigure(1401, handles, timeout=TIMEOUT))
        r.barrier("tried")
        r.reconfigure(1402, r.handles("recover"))
        return failure, r.where(), r.all_reduce()

    got = launch(backend, scenario)
    for rank, (failure, where, total) in enumerate(got):
        if rank < 2:
            assert_refused(failure, TIMEOUT + SLACK)
            assert failure[2] >= TIMEOUT / 2, f"gave up after {failure[2]:.2f} s: {failure[1]}"
        assert (where, total) == ((rank, WORLD), FULL)


@BACKENDS
def test_member_died(backend):
    """Rank 2's process ends: naming it fails within the timeout; the survivors shrink."""
    def scenario(r):
        handles = configured(r, 1500)
        if r.rank == 2:
            dist.destroy_process_group()
            os._exit(0)
        failure = refused(lambda: r.reconfigure(1501, handles, timeout=TIMEOUT))
        r.reconfigure(1502, r.handles("survivors", ranks=[0, 1]))
        return failure, r.where(), r.all_reduce()

    got = launch(backend, scenario, allow_exit=[2])
    assert got[2] is None
    for rank, (failure, where, total) in enumerate(got[:2]):
        assert_refused(failure, TIMEOUT + SLACK)
        assert (where, total) == ((rank, 2), 3)


def test_a_failed_call_is_the_backends_error_until_it_is_reconfigured():
    """ringcomm's get_error(), which fault-tolerance frameworks (torchft) read before they commit
    a step: SUCCESS, COMM_ERROR once a collective failed on a dead peer, SUCCESS again on the
    reconfigured group."""
    def scenario(r):
        configured(r, 1600)
        if r.rank == 2:
            dist.destroy_process_group()
            os._exit(0)
        before = r.backend_impl().get_error()
        failure = refused(r.all_reduce)
        failed = r.backend_impl().get_error()
        r.reconfigure(1601, r.handles("survivors", ranks=[0, 1]))
        return before.name, failure is not None, failed.name, r.backend_impl().get_error().name

    got = launch("ringcomm", scenario, allow_exit=[2])
    assert got[:2] == [("SUCCESS", True, "COMM_ERROR", "SUCCESS")] * 2


@BACKENDS
def test_collectives_before_reconfigure_raise(backend):
    def scenario(r):
        tensor = torch.ones(4, dtype=torch.int64)
        failures = [refused(lambda: dist.all_reduce(tensor)),
                    refused(lambda: dist.broadcast(tensor, src=0))]
        r.reconfigure(1600, r.handles("init"))
        return failures, r.all_reduce()

    for failures, total in launch(backend, scenario):
        for failure in failures:
            assert_refused(failure, TIMEOUT, ["reconfigure"])
        assert total == FULL


@BACKENDS
def test_rejects_multiple_backends(backend):
    """torch refuses the reconfigure API on a group of two backend types (gloo and nccl
    registered on a bare ProcessGroup). ringcomm serves every device of its group, so a group
    that mixes it with another ("cpu:ringcomm,cuda:gloo") is refused when it is made."""
    if backend == "gloo":
        pg = dist.ProcessGroup(0, 1)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO)
        pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL)
        failures = [refused(lambda: pg.supports_reconfigure), refused(pg.get_reconfigure_handle),
                    refused(lambda: pg.reconfigure(dist.distributed_c10d.ReconfigureOptions()))]
        for failure in failures:
            assert_refused(failure, TIMEOUT, ["multiple backends"])
    else:
        with pytest.raises(WorkerError, match="ringcomm serves every device of its group"):
            launch("cpu:ringcomm,cuda:gloo", lambda r: None, world_size=1)
