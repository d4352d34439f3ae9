"""Algorithms beside the ring (one_shot, two_shot, auto) on CPU shared memory: exact for every
algorithm x collective it runs x world size x dtype x op, bitwise identical across ranks and in
rank order for floats, and ranks that disagree or die fail with a clear error instead of
hanging."""
import os
import time

import pytest
import torch

import ringcomm
from launcher import launch
from ringcomm.options import ALGORITHM_COLLECTIVES, DEFAULTS, IN_HOST_ALGORITHMS
from sweep import DTYPES, OPS, make_input, op_valid, reduce_reference, wrong
from tiers import world_sizes

# Small publications, so that a few hundred elements already take several rounds.
PUBLISH_BYTES = 256
# Every algorithm the table adds that runs on shared memory, auto too (those between hosts:
# tests/test_recursive_doubling.py, tests/test_multihost.py).
ONE_HOP = tuple(a for a in IN_HOST_ALGORITHMS if a != "ring")
WIRES = (torch.bfloat16, torch.float16)


def counts_for(n, dtype):
    """0, 1, fewer than ranks, primes, non-multiples of 16 bytes, and several rounds."""
    round_elems = PUBLISH_BYTES // dtype.itemsize
    return sorted({0, 1, n - 1, 7, 13, round_elems + 1, 3 * round_elems + 5})


def exact_sweep(rank, n):
    """{case: (elements wrong, result)} for every algorithm x collective x dtype x op x count."""
    torch.set_num_threads(1)  # forked ranks on a shared host: torch's thread pool only waits
    comm = ringcomm.Communicator(timeout=60, publish_bytes=PUBLISH_BYTES,
                                 one_shot_max_bytes=64, two_shot_max_bytes=1024)
    results = {}

    def record(case, actual, expected):
        results[case] = (wrong(actual, expected), actual.clone())

    def runs(collective):
        return [a for a in ONE_HOP if collective in ALGORITHM_COLLECTIVES[a]]

    for dtype in DTYPES:
        for op in [o for o in OPS if op_valid(o, dtype)]:
            for count in counts_for(n, dtype):
                want = reduce_reference(n, count, op, dtype)
                for algorithm in runs("all_reduce"):
                    t = make_input(rank, n, count, op, dtype)
                    comm.all_reduce(t, op, algorithm=algorithm)
                    record((algorithm, "all_reduce", str(dtype), op, count), t, want)
                # reduce_scatter: input = every rank's block; out-of-place, then in place (the
                # output is this rank's block of the input).
                full = make_input(rank, n, count * n, op, dtype)
                want = reduce_reference(n, count * n, op, dtype)[rank * count:(rank + 1) * count]
                for algorithm in runs("reduce_scatter"):
                    out = torch.empty(count, dtype=dtype)
                    comm.reduce_scatter(out, full.clone(), op, algorithm=algorithm)
                    record((algorithm, "reduce_scatter", str(dtype), op, count), out, want)
                    inplace = full.clone()
                    block = inplace[rank * count:(rank + 1) * count]
                    comm.reduce_scatter(block, inplace, op, algorithm=algorithm)
                    record((algorithm, "reduce_scatter in place", str(dtype), op, count), block,
                           want)
        for count in counts_for(n, dtype):
            blocks = [make_input(r, n, count, "sum", dtype, salt=5) for r in range(n)]
            want = torch.cat(blocks)
            for algorithm in runs("all_gather"):
                out = torch.empty(count * n, dtype=dtype)
                comm.all_gather(out, blocks[rank], algorithm=algorithm)
                record((algorithm, "all_gather", str(dtype), count), out, want)
                inplace = torch.zeros(count * n, dtype=dtype)
                inplace[rank * count:(rank + 1) * count] = blocks[rank]
                comm.all_gather(inplace, inplace[rank * count:(rank + 1) * count],
                                algorithm=algorithm)
                record((algorithm, "all_gather in place", str(dtype), count), inplace, want)
    # float32 data on a 16-bit wire: exact inputs stay exact.
    for wire in WIRES:
        for op in ("sum", "prod", "min", "max", "avg"):
            for count in counts_for(n, torch.float32):
                want = reduce_reference(n, count, op, torch.float32)
                for algorithm in runs("all_reduce"):
                    t = make_input(rank, n, count, op, torch.float32)
                    comm.all_reduce(t, op, algorithm=algorithm, wire_dtype=wire)
                    record((algorithm, f"all_reduce on {wire}", op, count), t, want)
    comm.close()
    return results


@pytest.mark.parametrize("n", world_sizes([2, 3, 4, 5]))
def test_one_hop_algorithms_are_exact_for_every_collective_dtype_op_and_awkward_count(n):
    results = launch(n, exact_sweep, timeout=600)
    bad = {case: w for case, (w, _) in results[0].items() if w}
    assert not bad, bad
    kinds = {case[:2] for case in results[0]}
    assert kinds >= {("one_shot", "all_reduce"), ("two_shot", "all_reduce"),
                     ("one_shot", "reduce_scatter"), ("one_shot", "all_gather"),
                     ("auto", "all_gather"), ("one_shot", "all_reduce on torch.bfloat16")}
    for r in range(1, n):
        for case, (w, t) in results[r].items():
            assert w == 0, (r, case)


def float_order(rank, n):
    """Non-integer floats: every rank reduces in rank order 0..N-1 (with a wire, of the wire's
    values), so every rank holds the same bits."""
    comm = ringcomm.Communicator(timeout=60, publish_bytes=PUBLISH_BYTES)
    out = {}
    for algorithm in ("one_shot", "two_shot"):
        for dtype, wire in [(torch.float32, None), (torch.float64, None), (torch.bfloat16, None),
                            (torch.float16, None), (torch.float32, torch.bfloat16),
                            (torch.float32, torch.float16)]:
            inputs = [torch.randn(301, generator=torch.Generator().manual_seed(r)).to(dtype)
                      for r in range(n)]
            for op in ("sum", "prod"):
                t = inputs[rank].clone()
                comm.all_reduce(t, op, algorithm=algorithm, wire_dtype=wire)
                seen = [x.to(wire).to(dtype) if wire else x for x in inputs]
                expected = seen[0]
                for x in seen[1:]:
                    expected = expected + x if op == "sum" else expected * x
                out[algorithm, str(dtype), str(wire), op] = (t, expected)
    comm.close()
    return out


@pytest.mark.parametrize("n", [3, 4])
def test_float_results_follow_rank_order_and_agree_bitwise_across_ranks(n):
    results = launch(n, float_order)
    for case, (t, expected) in results[0].items():
        algorithm, _, wire, _ = case
        if algorithm == "one_shot" or wire == "None":
            # two_shot on a wire rounds its chunk once more before publishing it (as the ring).
            assert torch.equal(t, expected), case
        for r in range(1, n):
            assert torch.equal(results[r][case][0].view(torch.uint8), t.view(torch.uint8)), (r, case)


def choices(rank, n):
    """auto agrees with what it picks; bad names fail before anything is sent; different
    counts or algorithms fail with MismatchError."""
    comm = ringcomm.Communicator(timeout=20, publish_bytes=PUBLISH_BYTES,
                                 one_shot_max_bytes=64, two_shot_max_bytes=512)
    middle = "two_shot" if n > 2 else "ring"  # 2 ranks: two_shot saves no hop over the ring
    for count, picked in ((16, "one_shot"), (17, middle), (128, middle), (129, "ring")):
        t = torch.full((count,), float(rank + 1))
        comm.all_reduce(t, algorithm="auto" if rank == 0 else picked)
        assert torch.equal(t, torch.full((count,), float(n * (n + 1) // 2))), (count, picked)
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        comm.all_reduce(torch.ones(2), algorithm="tree")
    with pytest.raises(ringcomm.RingcommError, match="two_shot does not run reduce_scatter"):
        comm.reduce_scatter(torch.ones(2), torch.ones(2 * n), algorithm="two_shot")
    errors = []
    for mine, theirs in (((8, "one_shot"), (9, "one_shot")), ((8, "one_shot"), (8, "two_shot")),
                         ((8, "one_shot"), (8, "ring"))):
        count, algorithm = mine if rank == 0 else theirs
        with pytest.raises((ringcomm.MismatchError, ringcomm.PeerError)) as error:
            comm.all_reduce(torch.ones(count), algorithm=algorithm)
        errors.append((type(error.value).__name__, str(error.value)))
        comm.close()
        comm = ringcomm.Communicator(timeout=20, publish_bytes=PUBLISH_BYTES)
    comm.close()
    return errors


def test_auto_agrees_with_its_pick_and_ranks_that_disagree_fail_with_mismatch():
    start = time.monotonic()
    results = launch(2, choices, timeout=120)
    assert time.monotonic() - start < 60  # nobody waited for the 20 s timeout
    for case in range(3):
        kinds = [results[r][case][0] for r in range(2)]
        messages = " | ".join(results[r][case][1] for r in range(2))
        assert "MismatchError" in kinds, (case, messages)
    assert "count 9" in results[0][0][1] or "count 9" in results[1][0][1]
    assert "two_shot" in " ".join(results[r][1][1] for r in range(2))


def waits_on_a_missing_rank(rank, n, how):
    comm = ringcomm.Communicator(timeout=3)
    if rank == n - 1:
        if how == "dies":
            os._exit(0)
        time.sleep(6)
        return None
    start = time.monotonic()
    with pytest.raises((ringcomm.CommTimeoutError, ringcomm.PeerError)) as error:
        comm.all_reduce(torch.ones(4), algorithm="two_shot")
    return type(error.value).__name__, time.monotonic() - start, str(error.value)


@pytest.mark.parametrize("how", ["sleeps", "dies"])
def test_a_board_wait_names_collective_step_and_peer_when_a_rank_is_late_or_dead(how):
    n = 3
    results = launch(n, waits_on_a_missing_rank, how, timeout=60, allow_exit={n - 1})
    for kind, elapsed, message in results[:n - 1]:
        assert "all_reduce #0 (step" in message and "round 0 of 1" in message, message
        if how == "sleeps":
            # Rank 0 times out waiting for rank 2; rank 1 too, or it learns of rank 0's abort.
            assert kind in ("CommTimeoutError", "PeerError") and elapsed < 3 + 5, message
        else:
            assert kind == "PeerError" and elapsed < 3, message
    if how == "sleeps":  # the first to time out aborts the others
        assert any(kind == "CommTimeoutError" and "rank 2 to publish phase 0" in message
                   for kind, _, message in results[:n - 1]), results
    else:
        assert all("rank 2 (process" in m and "died" in m for _, _, m in results[:n - 1]), results


def shm_transport(rank, world):
    """An unconnected shared-memory transport: 4 slots of 4 KiB, no spinning, default yields and
    publications."""
    return ringcomm._C.ShmTransport(rank, world, 4096, 4, 5.0, 0, DEFAULTS["yield_us"],
                                    DEFAULTS["publish_bytes"])


def test_transports_without_publications_run_auto_as_the_ring_and_refuse_one_hop():
    """NCCL has no publications today; shared-memory peer links (a Transport without them)
    stand in for it: auto falls back to the ring, one_shot is refused before anything is sent."""
    C = ringcomm._C
    A, P = C.Algorithm, C.Collective
    links = C.ShmPeerLinks(0, 2, 4096, 4, 5.0, 0, DEFAULTS["yield_us"])
    comm = C.Communicator(0, 2, links, C.CpuReducer(), 4096)
    for collective in (P.all_reduce, P.reduce_scatter, P.all_gather):
        assert comm.resolve_algorithm(A.auto, collective, 8) == A.ring
    with pytest.raises(ringcomm.RingcommError, match="one_shot all_reduce needs a transport with "
                                                      "publications"):
        comm.resolve_algorithm(A.one_shot, P.all_reduce, 8)
    with pytest.raises(ringcomm.RingcommError, match="two_shot does not run all_gather"):
        comm.resolve_algorithm(A.two_shot, P.all_gather, 8)
    assert set(ALGORITHM_COLLECTIVES["one_shot"]) == {"all_reduce", "reduce_scatter", "all_gather"}
    assert ALGORITHM_COLLECTIVES["two_shot"] == ("all_reduce",)
    with pytest.raises(ringcomm.RingcommError, match="publications must hold at least 64 bytes"):
        C.ShmTransport(0, 2, 4096, 4, 5.0, 0, DEFAULTS["yield_us"], publish_bytes=32)
    alone = C.Communicator(0, 1, shm_transport(0, 1), C.CpuReducer(), 4096)
    assert alone.resolve_algorithm(A.two_shot, P.all_reduce, 8) == A.ring  # nothing to exchange


def test_auto_thresholds_pick_by_size_on_shared_memory():
    C = ringcomm._C
    A, P = C.Algorithm, C.Collective
    def communicator(world):  # transports not connected: choosing needs no peer
        return C.Communicator(0, world, shm_transport(0, world), C.CpuReducer(),
                              4096, thresholds={"one_shot_max_bytes": 100,
                                                "two_shot_max_bytes": 1000})

    sizes = (0, 100, 101, 1000, 1001)
    comm = communicator(3)
    picks = {b: comm.resolve_algorithm(A.auto, P.all_reduce, b) for b in sizes}
    assert picks == {0: A.one_shot, 100: A.one_shot, 101: A.two_shot, 1000: A.two_shot,
                     1001: A.ring}
    for collective in (P.reduce_scatter, P.all_gather):
        assert comm.resolve_algorithm(A.auto, collective, 1000) == A.one_shot
        assert comm.resolve_algorithm(A.auto, collective, 1001) == A.ring
    assert comm.resolve_algorithm(A.auto, P.broadcast, 8) == A.ring
    # 2 ranks: the ring takes as few hops as two_shot and the one-hop halves; one_shot still
    # saves one.
    pair = communicator(2)
    picks = {b: pair.resolve_algorithm(A.auto, P.all_reduce, b) for b in sizes}
    assert picks == {0: A.one_shot, 100: A.one_shot, 101: A.ring, 1000: A.ring, 1001: A.ring}
    for collective in (P.reduce_scatter, P.all_gather):
        assert pair.resolve_algorithm(A.auto, collective, 8) == A.ring
