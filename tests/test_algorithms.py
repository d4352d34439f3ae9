"""all_reduce algorithms beside the ring (one_shot, auto): exact, bitwise identical across ranks,
deterministic, and ranks that chose differently fail instead of corrupting."""
import time

import pytest
import torch

import ringcomm
from launcher import launch
from sweep import DTYPES, OPS, make_input, op_valid, reduce_reference, wrong

SLOT_BYTES = 256  # small slots: the auto threshold (one slot per rank) is a few dozen elements


def counts_for(n, dtype):
    at_threshold = SLOT_BYTES // dtype.itemsize
    return sorted({0, 1, n - 1, 7, 13, at_threshold, at_threshold + 1})


def exact_sweep(rank, n):
    """{(algorithm, dtype, op, count): elements wrong or differing from rank 0}: every case."""
    comm = ringcomm.Communicator(timeout=60, slot_bytes=SLOT_BYTES)
    results = {}
    for algorithm in ("one_shot", "auto"):
        for dtype in DTYPES:
            for op in OPS:
                if not op_valid(op, dtype):
                    continue
                for count in counts_for(n, dtype):
                    t = make_input(rank, n, count, op, dtype)
                    comm.all_reduce(t, op, algorithm=algorithm)
                    results[algorithm, str(dtype), op, count] = (
                        wrong(t, reduce_reference(n, count, op, dtype)), t)
    comm.close()
    return results


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_one_shot_and_auto_are_exact_for_every_dtype_op_and_awkward_count(n):
    results = launch(n, exact_sweep, timeout=300)
    bad = {case: w for case, (w, _) in results[0].items() if w}
    assert not bad, bad
    assert len(results[0]) > 2 * len(DTYPES) * 5
    for r in range(1, n):
        for case, (w, t) in results[r].items():
            assert w == 0 and torch.equal(t.view(torch.uint8), results[0][case][1].view(torch.uint8)), (r, case)


def float_order(rank, n):
    """Non-integer floats: one_shot must reduce in rank order 0..N-1 on every rank."""
    comm = ringcomm.Communicator(timeout=60, slot_bytes=SLOT_BYTES)
    out = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        inputs = [torch.randn(37, generator=torch.Generator().manual_seed(r)).to(dtype)
                  for r in range(n)]
        for op in ("sum", "prod"):
            t = inputs[rank].clone()
            comm.all_reduce(t, op, algorithm="one_shot")
            expected = inputs[0]
            for x in inputs[1:]:
                expected = expected + x if op == "sum" else expected * x
            out[str(dtype), op] = (t, expected)
    comm.close()
    return out


@pytest.mark.parametrize("n", [3, 4])
def test_one_shot_float_results_follow_rank_order_and_agree_bitwise(n):
    results = launch(n, float_order)
    for case, (t, expected) in results[0].items():
        assert torch.equal(t, expected), case
        for r in range(1, n):
            assert torch.equal(results[r][case][0].view(-1), t.view(-1)), (r, case)


def mixed_choices(rank, n):
    """Pairs of per-rank choices that must agree (auto picks one_shot up to one slot, the ring
    above), then one that must not."""
    comm = ringcomm.Communicator(timeout=20, slot_bytes=SLOT_BYTES)
    small, large = SLOT_BYTES // 4, SLOT_BYTES // 4 + 1  # float32 elements
    for count, other in ((small, "one_shot"), (large, "ring")):
        t = torch.full((count,), float(rank + 1))
        comm.all_reduce(t, algorithm="auto" if rank == 0 else other)
        assert torch.equal(t, torch.full((count,), float(n * (n + 1) // 2))), (count, other)
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        comm.all_reduce(torch.ones(2), algorithm="tree")  # checked before anything is sent
    with pytest.raises(ringcomm.RingcommError, match="no wire_dtype"):
        comm.all_reduce(torch.ones(2), algorithm="one_shot", wire_dtype=torch.bfloat16)
    t = torch.ones(8)
    with pytest.raises((ringcomm.MismatchError, ringcomm.PeerError)) as error:
        comm.all_reduce(t, algorithm="one_shot" if rank == 0 else "ring")
    comm.close()
    return type(error.value).__name__, str(error.value)


def test_auto_agrees_with_the_algorithm_it_picks_and_different_choices_fail():
    results = launch(2, mixed_choices, timeout=120)
    assert any(kind == "MismatchError" and "one_shot" in message for kind, message in results), results


def absent_peer(rank, n):
    comm = ringcomm.Communicator(timeout=2)
    if rank == 1:
        time.sleep(4)
        return None
    start = time.monotonic()
    with pytest.raises(ringcomm.CommTimeoutError) as error:
        comm.all_reduce(torch.ones(2), algorithm="one_shot")
    return time.monotonic() - start, str(error.value)


def test_one_shot_waits_past_the_timeout_name_collective_and_peer():
    elapsed, message = launch(2, absent_peer, timeout=60)[0]
    assert 2 <= elapsed < 2 + 5
    assert "all_reduce #0" in message and "rank 1" in message, message
