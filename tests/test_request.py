"""The collective request (_C.CollectiveRequest, _C.Communicator.run): every collective through
it matches the exact reference on real processes, positionally and with keywords; a bad field
raises an error naming it before anything is sent, and leaves the communicator usable."""
import pytest
import torch

import ringcomm
from launcher import launch
from ringcomm import _C
from ringcomm.options import DEFAULTS
from sweep import make_input, reduce_reference, wrong

R, P, D, O, A = _C.CollectiveRequest, _C.Collective, _C.DataType, _C.RedOp, _C.Algorithm


def _cpu_ring(world_size):
    """The CPU backend's _C.Communicator over the launcher's default group."""
    from ringcomm import CommOptions
    from ringcomm.transport import cpu
    from ringcomm.world.rendezvous import Rendezvous

    return cpu.create(Rendezvous(None, timeout=30), CommOptions(timeout=30).resolved(world_size))


def every_collective_by_request(rank, n):
    """{case: elements wrong} for every collective run by request, against tests/support/sweep.py."""
    torch.set_num_threads(1)
    comm = _cpu_ring(n)
    count, root, dtype = 7, n - 1, torch.int32
    ptr = torch.Tensor.data_ptr
    wrongs = {}

    t = make_input(rank, n, count, "max", dtype)
    comm.run(R(P.all_reduce, output=ptr(t), count=count, dtype=D.int32, op=O.max))
    wrongs["all_reduce"] = wrong(t, reduce_reference(n, count, "max", dtype))

    t = make_input(rank, n, count, "sum", torch.float32)
    comm.run(R(P.all_reduce, ptr(t), 0, count, D.float32, O.sum, 0, A.one_shot, D.bfloat16))
    wrongs["all_reduce one_shot on a bfloat16 wire"] = wrong(
        t, reduce_reference(n, count, "sum", torch.float32))

    t = make_input(rank, n, count, "sum", dtype)  # the fields positionally: the hot path's form
    comm.run(P.all_reduce, ptr(t), 0, count, D.int32, O.sum, 0, A.ring, None, 0)
    wrongs["all_reduce positionally"] = wrong(t, reduce_reference(n, count, "sum", dtype))

    full = make_input(rank, n, count * n, "sum", dtype)
    out = torch.zeros(count, dtype=dtype)
    comm.run(R(P.reduce_scatter, output=ptr(out), input=ptr(full), count=count, dtype=D.int32))
    want = reduce_reference(n, count * n, "sum", dtype)[rank * count:(rank + 1) * count]
    wrongs["reduce_scatter"] = wrong(out, want)

    blocks = [make_input(r, n, count, "sum", dtype, salt=r) for r in range(n)]
    out = torch.zeros(count * n, dtype=dtype)
    comm.run(R(P.all_gather, output=ptr(out), input=ptr(blocks[rank]), count=count,
               dtype=D.int32, algorithm=A.auto))
    wrongs["all_gather"] = wrong(out, torch.cat(blocks))

    t = blocks[rank].clone()
    comm.run(R(P.broadcast, output=ptr(t), count=count, dtype=D.int32, root=root))
    wrongs["broadcast"] = wrong(t, blocks[root])

    t = make_input(rank, n, count, "prod", dtype)
    comm.run(R(P.reduce, output=ptr(t), count=count, dtype=D.int32, op=O.prod, root=root))
    if rank == root:
        wrongs["reduce"] = wrong(t, reduce_reference(n, count, "prod", dtype))

    out = torch.zeros(count * n, dtype=dtype) if rank == root else None
    comm.run(R(P.gather, output=ptr(out) if out is not None else 0, input=ptr(blocks[rank]),
               count=count, dtype=D.int32, root=root))
    if rank == root:
        wrongs["gather"] = wrong(out, torch.cat(blocks))

    out = torch.zeros(count, dtype=dtype)
    everyone = torch.cat(blocks)
    comm.run(R(P.scatter, output=ptr(out), input=ptr(everyone) if rank == root else 0,
               count=count, dtype=D.int32, root=root))
    wrongs["scatter"] = wrong(out, blocks[rank])
    comm.close()
    return wrongs


@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_by_request_matches_the_reference(n):
    results = launch(n, every_collective_by_request, timeout=120)
    for rank, wrongs in enumerate(results):
        assert not any(wrongs.values()), (rank, wrongs)
    # The root ran every collective the schedule plans (a new one needs its case above).
    assert {case.split()[0] for case in results[-1]} == {p.name for p in _C.PLANNED_COLLECTIVES}


def _alone():
    """A one-rank communicator: its checks run before anything would be sent."""
    transport = _C.ShmTransport(0, 1, 4096, 4, 5.0, 0, DEFAULTS["yield_us"],
                                DEFAULTS["publish_bytes"])
    return _C.Communicator(0, 1, transport, _C.CpuReducer(), 4096)


def _pair():
    """Rank 0 of two, never connected: a request it accepts would wait for rank 1, so only
    requests it refuses may be run on it."""
    transport = _C.ShmTransport(0, 2, 4096, 4, 5.0, 0, DEFAULTS["yield_us"],
                                DEFAULTS["publish_bytes"])
    return _C.Communicator(0, 2, transport, _C.CpuReducer(), 4096)


def test_a_bad_field_raises_naming_it_and_leaves_the_communicator_usable():
    x = torch.arange(8, dtype=torch.float32)
    a = x.data_ptr()
    bad = [
        (R(P.all_to_all, a, a, 8), "all_to_all is not a collective request"),
        (R(P.broadcast, a, 0, 8, root=1), "src=1 is not a rank of this 1-rank communicator"),
        (R(P.all_reduce, a, 0, 8, root=1), "all_reduce has no root"),
        (R(P.all_gather, a, a, 8, op=O.max), "all_gather does not reduce: leave op at sum"),
        (R(P.reduce_scatter, a, a, 8, wire_dtype=D.bfloat16), "reduce_scatter takes no wire"),
        (R(P.all_reduce, a, a + 4, 8), "all_reduce runs in place on its output"),
        (R(P.all_reduce, 0, 0, 8), "all_reduce needs an output on rank 0"),
        (R(P.all_gather, a, 0, 8), "all_gather needs an input on rank 0"),
        (R(P.broadcast, a, 0, 8, algorithm=A.one_shot), "one_shot does not run broadcast"),
        (R(P.all_reduce, a, 0, 8, op=O.band), "op 'band' is only defined for integer"),
        (R(P.all_reduce, a, 0, 8, dtype=D.int32, wire_dtype=D.float16), "int32 data cannot travel"),
    ]
    comm = _alone()
    for request, message in bad:
        with pytest.raises(ringcomm.RingcommError, match=message):
            comm.run(request)
    assert comm.failure == ""
    comm.run(R(P.all_reduce, a, 0, 8, op=O.max))  # still usable, and one rank keeps its data
    assert torch.equal(x, torch.arange(8, dtype=torch.float32))
    comm.close()

    pair = _pair()
    for request, message in [
            (R(P.reduce, a, 0, 8, root=2), "dst=2 is not a rank of this 2-rank communicator"),
            (R(P.gather, 0, a, 8, root=0), "gather needs an output on rank 0"),
            (R(P.scatter, a, 0, 8, root=0), "scatter needs an input on rank 0"),
    ]:
        with pytest.raises(ringcomm.RingcommError, match=message):
            pair.run(request)
    assert pair.failure == ""
    pair.close()


def test_a_request_reads_back_what_it_was_given():
    request = R(P.gather, output=0x1000, input=0x2000, count=3, dtype=D.bfloat16, root=1,
                stream=7)
    assert (request.collective, request.output, request.input, request.count, request.dtype,
            request.op, request.root, request.algorithm, request.wire_dtype, request.stream) == \
        (P.gather, 0x1000, 0x2000, 3, D.bfloat16, O.sum, 1, A.ring, None, 7)
    request.op, request.wire_dtype = O.max, D.float16
    assert (request.op, request.wire_dtype) == (O.max, D.float16)
    text = repr(request)
    assert text.startswith("CollectiveRequest(gather, output=0x1000") and "root=1" in text
    assert R(P.all_reduce, 1, 2, 3, D.int8, O.min, 0, A.auto, D.int8, 4).algorithm == A.auto
    with pytest.raises(TypeError):
        R(P.all_reduce, count=-1)  # counts are sizes
    # The debug exchange's header is the request's (the algorithm as asked for).
    header = _C.collective_header(request)
    assert _C.describe_collective(header).startswith("gather (count 3, bfloat16")


def hot_path(rank, n):
    """Communicator.try_run_now: runs a request at once, unless the options ask for the debug
    exchange (then False, nothing done)."""
    from ringcomm.request import CollectiveRequest

    comm = ringcomm.Communicator(timeout=30)
    t = torch.full((4,), float(rank + 1))
    algorithm = comm.default_algorithm("all_reduce")
    ran = comm.try_run_now(CollectiveRequest(P.all_reduce, t.data_ptr(), 0, 4, D.float32, O.sum,
                                             0, algorithm))
    checked = ringcomm.Communicator(timeout=30, debug=True)
    u = torch.ones(4)
    skipped = checked.try_run_now(CollectiveRequest(P.all_reduce, u.data_ptr(), 0, 4, D.float32,
                                                    O.sum, 0, checked.default_algorithm("all_reduce")))
    checked.all_reduce(u)  # the checked route instead, on every rank
    comm.close()
    checked.close()
    return ran, t.tolist(), skipped, u.tolist(), algorithm, comm.default_algorithm("broadcast")


def test_try_run_now_runs_at_once_unless_checks_are_asked_for():
    for ran, t, skipped, u, algorithm, broadcast in launch(2, hot_path, timeout=60):
        assert ran is True and t == [3.0] * 4
        assert skipped is False and u == [2.0] * 4
        assert algorithm == A.auto and broadcast == A.ring  # the option; broadcast takes none


def test_the_python_request_mirrors_the_c_one():
    """ringcomm.request.CollectiveRequest: the C++ request's fields, defaults and order."""
    from ringcomm.request import CollectiveRequest

    mine = CollectiveRequest(P.gather, 1, 2, 3, D.bfloat16, O.max, 1, A.auto, D.int8)
    theirs = mine.to_c(stream=4)
    assert (theirs.collective, theirs.output, theirs.input, theirs.count, theirs.dtype,
            theirs.op, theirs.root, theirs.algorithm, theirs.wire_dtype, theirs.stream) == \
        (P.gather, 1, 2, 3, D.bfloat16, O.max, 1, A.auto, D.int8, 4)
    default, c_default = CollectiveRequest(P.all_reduce), R(P.all_reduce)
    assert [getattr(default, f) for f in CollectiveRequest._fields] == \
        [getattr(c_default, f) for f in CollectiveRequest._fields]
