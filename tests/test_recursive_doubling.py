"""recursive_doubling all_reduce over TCP (_C.SocketTransport on 127.0.0.1, real processes): exact
for every dtype x op x awkward count at power-of-two world sizes and not, bitwise alike on every
rank, auto's pick by size on transports by what they reach, and the failures: a mismatch at the
first message, a killed peer named promptly. Across emulated hosts: tests/test_multihost.py."""
import time

import pytest
import torch
import torch.distributed as dist

import ringcomm
from collective_checks import VALID, Checker, counts_for, one_dtype_per_op
from launcher import die_soon, launch
from ringcomm import _C
from ringcomm.options import DEFAULTS, THRESHOLDS
from sweep import reduce_reference
from test_socket_transport import BIG, communicator_over_tcp, tcp_comm

RD = _C.Algorithm.recursive_doubling


def exact_sweep(rank, n):
    torch.set_num_threads(1)
    comm = communicator_over_tcp(timeout=60)
    checker = Checker(comm)
    cases = VALID if n <= 3 else one_dtype_per_op()
    # 0, 1, fewer than ranks, primes, and BIG: many 4 KiB messages per exchange.
    for count in sorted(set(counts_for(n)) | {13, BIG}):
        for dtype, op in cases if count < BIG else [(torch.float32, "avg"), (torch.int64, "sum")]:
            t = checker.input(rank, count, op, dtype)
            comm.all_reduce(t, op=op, algorithm="recursive_doubling")
            checker.check(f"{dtype} {op} count {count}", t, reduce_reference(n, count, op, dtype))
            if dtype.is_floating_point and count > 0:  # the same bits on every rank
                every = torch.empty(n * count, dtype=dtype)
                comm.all_gather(every, t, algorithm="ring")
                same = all(torch.equal(every[q * count:(q + 1) * count], t) for q in range(n))
                checker.check(f"alike {dtype} {op} count {count}", torch.tensor([same]),
                              torch.tensor([True]))
    comm.close()
    return checker.failures, checker.cases


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_recursive_doubling_is_exact_and_alike_on_every_rank(n):
    for failures, cases in launch(n, exact_sweep, timeout=300):
        assert cases > 20 and not failures, failures[:10]


def on_a_wire(rank, n):
    comm = communicator_over_tcp(timeout=30)
    t = torch.full((100,), float(rank + 1))
    comm.all_reduce(t, wire_dtype=torch.bfloat16, algorithm="auto")  # the ring on a wire
    with pytest.raises(ringcomm.RingcommError, match="recursive_doubling all_reduce sends the "
                                                      "data's own dtype"):
        comm.all_reduce(t, wire_dtype=torch.bfloat16, algorithm="recursive_doubling")
    comm.all_reduce(t, algorithm="recursive_doubling")  # still usable: refused before sending
    comm.close()
    return t.tolist()


def test_a_16_bit_wire_takes_the_ring_under_auto_and_is_refused_when_asked_for():
    for values in launch(3, on_a_wire, timeout=60):
        assert values == [18.0] * 100  # 1+2+3, then that sum over the 3 ranks


def test_auto_picks_recursive_doubling_by_size_where_the_transport_reaches_every_rank():
    A, P = _C.Algorithm, _C.Collective
    limit = THRESHOLDS["recursive_doubling_max_bytes"]
    for world in (2, 3, 8):
        assert _C.choose_algorithm(P.all_reduce, limit, world, publications=False) == A.ring
    links = _C.ShmPeerLinks(0, 2, 4096, 4, 5.0, 0, DEFAULTS["yield_us"])
    comm = _C.Communicator(0, 2, links, _C.CpuReducer(), 4096)
    assert comm.resolve_algorithm(A.auto, P.all_reduce, 8) == A.ring  # neighbours only
    with pytest.raises(ringcomm.RingcommError, match="recursive_doubling all_reduce needs a "
                                                      "transport that reaches every rank"):
        comm.resolve_algorithm(RD, P.all_reduce, 8)
    with pytest.raises(ringcomm.RingcommError, match="recursive_doubling does not run all_gather"):
        comm.resolve_algorithm(RD, P.all_gather, 8)


def picks(rank, n):
    _, comm = tcp_comm(rank, n, 30)
    A, P = _C.Algorithm, _C.Collective
    limit = THRESHOLDS["recursive_doubling_max_bytes"]
    chosen = {b: comm.resolve_algorithm(A.auto, P.all_reduce, b).name for b in (0, limit, limit + 1)}
    chosen["reduce_scatter"] = comm.resolve_algorithm(A.auto, P.reduce_scatter, 0).name
    return chosen


def test_auto_over_tcp_runs_recursive_doubling_up_to_its_threshold_then_the_ring():
    limit = THRESHOLDS["recursive_doubling_max_bytes"]
    assert launch(2, picks, timeout=60)[0] == {0: "recursive_doubling", limit: "recursive_doubling",
                                               limit + 1: "ring", "reduce_scatter": "ring"}


def mismatched_count(rank, n):
    _, comm = tcp_comm(rank, n, 20)
    t = torch.ones(10 + rank)
    start = time.monotonic()
    with pytest.raises((ringcomm.MismatchError, ringcomm.PeerError)) as error:
        comm.run(_C.Collective.all_reduce, t.data_ptr(), 0, t.numel(), _C.DataType.float32,
                 _C.RedOp.sum, 0, RD, None, 0)
    return type(error.value).__name__, time.monotonic() - start, str(error.value)


def test_a_count_mismatch_raises_at_the_first_message():
    results = launch(4, mismatched_count, timeout=60)
    assert all(elapsed < 10 for _, elapsed, _ in results), results
    assert any(kind == "MismatchError" and "collective mismatch: rank" in message
               and "all_reduce #0 (step 1 of" in message for kind, _, message in results), results


def killed_mid_doubling(rank, n):
    _, comm = tcp_comm(rank, n, 60)
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(1000)

    def run():
        comm.run(_C.Collective.all_reduce, t.data_ptr(), 0, t.numel(), _C.DataType.float32,
                 _C.RedOp.sum, 0, RD, None, 0)

    run()
    if rank == n - 1:
        die_soon(store)
    with pytest.raises(ringcomm.PeerError) as error:
        for _ in range(100000):
            run()
    return time.time() - float(store.get("killed_at")), str(error.value)


@pytest.mark.parametrize("n", [3, 4])
def test_a_killed_peer_is_named_by_every_survivor_promptly(n):
    results = launch(n, killed_mid_doubling, timeout=120, allow_exit={n - 1})
    delays = [delay for delay, _ in results[:-1]]
    assert all(d < 5 for d in delays), f"survivors noticed after {delays} s (timeout was 60 s)"
    assert all(f"rank {n - 1} (host-{n - 1}, 127.0.0.1:" in m for _, m in results[:-1]), results
