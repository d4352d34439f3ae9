"""recursive_doubling over TCP (_C.SocketTransport on 127.0.0.1, real processes): all_reduce, and
reduce_scatter by recursive halving and all_gather by recursive doubling, as plans for 2..64
ranks and exact for every dtype x op x awkward count at power-of-two world sizes and not,
all_reduce bitwise alike on every rank, auto's pick by size and rank count on transports by what
they reach, and the failures: a mismatch at the first message, a killed peer named promptly.
Across emulated hosts: tests/test_multihost.py."""
import time
from collections import Counter

import pytest
import torch
import torch.distributed as dist

import ringcomm
from collective_checks import VALID, Checker, counts_for, one_dtype_per_op
from launcher import die_soon, launch
from ringcomm import _C
from ringcomm.options import DEFAULTS, THRESHOLDS
from sweep import reduce_reference
from test_schedule import simulate_point_to_point
from test_socket_transport import BIG, communicator_over_tcp, tcp_comm

RD = _C.Algorithm.recursive_doubling


@pytest.mark.parametrize("n", range(2, 65))
def test_log_step_reduce_scatter_and_all_gather_plans_end_right_in_log_depth(n):
    power = 1 << (n.bit_length() - 1)
    rounds = power.bit_length() - 1 + (2 if power < n else 0)  # and the fold and unfold
    for count in (1, 3):
        blocks, depth, plans = simulate_point_to_point("recursive_doubling", n, count,
                                                       "reduce_scatter")
        assert [b[r] for r, b in enumerate(blocks)] == [Counter(range(n))] * n
        assert max(depth) <= rounds, depth
        for r, plan in enumerate(plans):
            # One message per round; AVG divides once, where the rank's own block is reduced
            # last (a folded rank receives it divided).
            assert sum(s["send_to"] >= 0 for s in plan["steps"]) <= rounds - (power < n)
            folded = r < 2 * (n - power) and r % 2 == 1
            assert sum(s["finalize"] for s in plan["steps"]) == (0 if folded else 1), plan
        blocks, depth, plans = simulate_point_to_point("recursive_doubling", n, count,
                                                       "all_gather")
        assert blocks == [{b: ("data", b) for b in range(n)}] * n
        assert max(depth) <= rounds, depth
        assert all(sum(s["send_to"] >= 0 for s in p["steps"]) <= rounds - (power < n)
                   for p in plans)


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
    checker.scatter_gather_sweep(sorted(set(counts_for(n)) | {13, BIG, 100_003}), one_dtype_per_op(),
                                 "recursive_doubling")
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


def test_auto_picks_recursive_doubling_only_where_the_transport_reaches_every_rank():
    A, P = _C.Algorithm, _C.Collective
    for world in (2, 3, 8):
        assert _C.choose_algorithm(P.all_reduce, 8, world, publications=False) == A.ring
    links = _C.ShmPeerLinks(0, 2, 4096, 4, 5.0, 0, DEFAULTS["yield_us"])
    comm = _C.Communicator(0, 2, links, _C.CpuReducer(), 4096)
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        assert comm.resolve_algorithm(A.auto, P.__members__[collective], 8) == A.ring  # neighbours
        with pytest.raises(ringcomm.RingcommError, match=f"recursive_doubling {collective} needs "
                                                          "a transport that reaches every rank"):
            comm.resolve_algorithm(RD, P.__members__[collective], 8)
    with pytest.raises(ringcomm.RingcommError, match="recursive_doubling does not run broadcast"):
        comm.resolve_algorithm(RD, P.broadcast, 8)


# The largest bytes auto runs recursive_doubling for, by rank count (logStepMaxBytes in
# algorithms.h): the alpha-beta model's crossover, at most 256 KiB.
MODEL = {"all_reduce": {2: 256 << 10, 3: 26_106, 4: 202_730, 5: 48_291, 6: 68_277, 8: 208_468,
                        64: 256 << 10, 1024: 256 << 10},
         "reduce_scatter": {2: 256 << 10, 3: 81, 4: 256 << 10, 5: 25_278, 6: 46_871,
                            8: 256 << 10, 64: 256 << 10, 1024: 256 << 10}}
MODEL["all_gather"] = MODEL["reduce_scatter"]


def largest_picked(comm, collective):
    """The largest size resolve_algorithm(auto) runs recursive_doubling for (it picks by size)."""
    low, high = 0, 1 << 30  # low picks it (or is 0), high does not
    while high - low > 1:
        middle = (low + high) // 2
        picked = comm.resolve_algorithm(_C.Algorithm.auto, collective, middle) == RD
        low, high = (middle, high) if picked else (low, middle)
    return low


def test_auto_over_tcp_switches_to_the_ring_where_the_model_says_for_each_rank_count():
    secret = bytes(_C.SECRET_BYTES)
    for world in MODEL["all_reduce"]:  # rank 0 of `world`, never connected: nothing is sent
        tcp = _C.SocketTransport(0, world, 4096, 4, 1, 5.0, "127.0.0.1", secret, False)
        for name, expected in MODEL.items():
            comm = _C.Communicator(0, world, tcp, _C.CpuReducer(), 4096)
            assert largest_picked(comm, _C.Collective.__members__[name]) == expected[world], \
                (name, world)
        for limit in (0, 100, 4 << 20):  # set, the option wins at every rank count
            comm = _C.Communicator(0, world, tcp, _C.CpuReducer(), 4096,
                                   {"recursive_doubling_max_bytes": limit})
            for name in MODEL:
                assert largest_picked(comm, _C.Collective.__members__[name]) == limit
        assert comm.resolve_algorithm(_C.Algorithm.auto, _C.Collective.broadcast, 8) == \
            _C.Algorithm.ring
    assert THRESHOLDS["recursive_doubling_max_bytes"] == ringcomm.options.BY_HOST_COUNT


def run_call(comm, collective, rank, n, count):
    """A recursive_doubling call of `collective` on float32 ones, straight on a _C.Communicator:
    returns a function that runs it."""
    out = torch.ones(count * (n if collective == "all_gather" else 1))
    inp = torch.ones(count * (n if collective == "reduce_scatter" else 1))
    inp_ptr = 0 if collective == "all_reduce" else (
        out[rank * count:].data_ptr() if collective == "all_gather" else inp.data_ptr())
    return lambda: comm.run(_C.Collective.__members__[collective], out.data_ptr(), inp_ptr, count,
                            _C.DataType.float32, _C.RedOp.sum, 0, RD, None, 0)


def mismatched_count(rank, n, collective):
    _, comm = tcp_comm(rank, n, 20)
    start = time.monotonic()
    with pytest.raises((ringcomm.MismatchError, ringcomm.PeerError)) as error:
        run_call(comm, collective, rank, n, 10 + rank)()
    return type(error.value).__name__, time.monotonic() - start, str(error.value)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
def test_a_count_mismatch_raises_at_the_first_message(collective):
    results = launch(4, mismatched_count, collective, timeout=60)
    assert all(elapsed < 10 for _, elapsed, _ in results), results
    assert any(kind == "MismatchError" and "collective mismatch: rank" in message
               and f"{collective} #0 (step 1 of" in message for kind, _, message in results), results


def killed_mid_doubling(rank, n, collective):
    _, comm = tcp_comm(rank, n, 60)
    store = dist.distributed_c10d._get_default_store()
    run = run_call(comm, collective, rank, n, 1000)
    run()
    if rank == n - 1:
        die_soon(store)
    with pytest.raises(ringcomm.PeerError) as error:
        for _ in range(100000):
            run()
    return time.time() - float(store.get("killed_at")), str(error.value)


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [3, 4])
def test_a_killed_peer_is_named_by_every_survivor_promptly(n, collective):
    results = launch(n, killed_mid_doubling, collective, timeout=120, allow_exit={n - 1})
    delays = [delay for delay, _ in results[:-1]]
    assert all(d < 5 for d in delays), f"survivors noticed after {delays} s (timeout was 60 s)"
    assert all(f"rank {n - 1} (host-{n - 1}, 127.0.0.1:" in m for _, m in results[:-1]), results
