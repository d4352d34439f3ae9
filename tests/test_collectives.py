"""Every collective on real processes over shared memory, against exact references.

One process launch per world size runs the whole sweep (dtype x op x count x in/out-of-place)
and returns every mismatch, nccl-tests style (#wrong elements per case)."""
import pytest
import torch

from collective_checks import VALID, Checker, counts_for, one_dtype_per_op
from launcher import launch
from sweep import DTYPES, OPS
from tiers import world_sizes

BIG_PRIME = 1_000_003
BIG_CASES = [(torch.float32, "sum"), (torch.float32, "avg"), (torch.bfloat16, "sum"),
             (torch.float16, "max"), (torch.int64, "bxor"), (torch.int8, "prod")]


# World size: (dtype x op cases, counts, the copies' dtypes, big cases). Every dtype x op x
# collective x awkward count runs at 2, 3, 4 and 5 ranks, every big case at 2 and 3. A big
# buffer costs O(world size) per rank, so larger worlds get one big case each, and 8 ranks on a
# 2-core machine get one dtype per op (and every dtype's copies).
PLANS = {
    1: (VALID, counts_for(1), DTYPES, BIG_CASES[:1]),
    2: (VALID, counts_for(2), DTYPES, BIG_CASES),
    3: (VALID, counts_for(3), DTYPES, BIG_CASES),
    4: (VALID, counts_for(4), DTYPES, [(torch.float32, "avg")]),
    5: (VALID, counts_for(5), DTYPES, [(torch.float16, "max")]),
    8: (one_dtype_per_op(), counts_for(8), DTYPES, [(torch.float32, "sum")]),
}


def sweep(rank, n, cases, counts, copy_dtypes, big):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60)
    checker = Checker(comm)
    for count in counts:
        for dtype, op in cases:
            checker.reductions(count, dtype, op)
        for dtype in copy_dtypes:
            checker.copies(count, dtype)
    for dtype, op in big:
        checker.reductions(BIG_PRIME, dtype, op)
    if big:
        checker.copies(BIG_PRIME, torch.float32)
    checker.numpy_arrays()
    comm.close()
    return checker.failures, checker.cases


def test_the_sweep_covers_every_dtype_op_collective_and_awkward_count():
    dtype_ops = {case for cases, _, _, _ in PLANS.values() for case in cases}
    assert dtype_ops == set(VALID)
    copied = {dtype for _, _, dtypes, _ in PLANS.values() for dtype in dtypes}
    assert copied == set(DTYPES)
    for n, (cases, counts, dtypes, big) in PLANS.items():
        assert {0, 1, n + 1} <= set(counts) and big, n
        assert n < 3 or n - 1 in counts  # fewer elements than ranks
        assert {op for _, op in cases} == set(OPS), n


@pytest.mark.parametrize("n", world_sizes(PLANS))
def test_every_collective_dtype_op_and_count_is_exact(n):
    results = launch(n, sweep, *PLANS[n], timeout=600)
    failures = [f for rank_failures, _ in results for f in rank_failures]
    assert results[0][1] > 500
    assert not failures, f"{len(failures)} wrong cases, first: " + "\n".join(failures[:10])


def tight_slots(rank, n, slot_count):
    import ringcomm

    # Forwarded slices (all_gather, broadcast, gather, scatter) keep their slot until the last
    # rank round the ring has read them: with few, small slots the ring must still not deadlock.
    comm = ringcomm.Communicator(timeout=60, slot_bytes=256, slot_count=slot_count)
    checker = Checker(comm)
    for count in (n - 1, 67, 1009):  # up to 16 slices of 64 elements per chunk
        checker.reductions(count, torch.float32, "sum")
        checker.copies(count, torch.int32)
    comm.close()
    return checker.failures, checker.cases


@pytest.mark.parametrize("n,slot_count", [(3, 2), (5, 2), (5, 4)])
def test_forwarding_with_few_small_slots_is_exact(n, slot_count):
    results = launch(n, tight_slots, slot_count, timeout=300)
    failures = [f for rank_failures, _ in results for f in rank_failures]
    assert results[0][1] > 20
    assert not failures, "\n".join(failures[:10])


def results_with_slice(rank, n, slice_bytes):
    import ringcomm

    comm = ringcomm.Communicator(timeout=60, slice_bytes=slice_bytes)
    outputs = []
    for dtype in (torch.float32, torch.bfloat16, torch.int8, torch.float64):
        for count in (n + 1, 7, 1000, 4099):
            t = torch.randn(count).mul(100).to(dtype)  # arbitrary values: order-dependent rounding
            torch.manual_seed(1000 * rank + count)
            t = torch.randn(count).mul(100).to(dtype)
            comm.all_reduce(t, op="sum")
            outputs.append(t)
            out = torch.empty(count, dtype=dtype)
            comm.reduce_scatter(out, torch.randn(n * count).mul(100).to(dtype))
            outputs.append(out)
    comm.close()
    return outputs


@pytest.mark.parametrize("n", [3, 4])
def test_results_are_identical_across_slice_sizes_and_ranks(n):
    """Real-valued inputs round differently in different orders: the ring's order must not
    depend on the slice size, and every rank must end with the same bits."""
    reference = launch(n, results_with_slice, 1 << 20)
    for slice_bytes in (8, 40, 1000):
        other = launch(n, results_with_slice, slice_bytes)
        for rank in range(n):
            for a, b in zip(reference[rank], other[rank]):
                assert torch.equal(a, b), f"slice {slice_bytes} B changes rank {rank}'s result"
    for rank in range(1, n):
        for k in range(0, len(reference[0]), 2):  # all_reduce outputs: identical on every rank
            assert torch.equal(reference[0][k], reference[rank][k])


@pytest.mark.system  # the GPU check's whole world-2 sweep
def test_the_gpu_checks_world2_sweep_is_exact_on_cpu():
    """The GPU check's first test (tests/test_gpu.py: world2_sweep) run on CPU tensors: its
    cases and references are proven before a GPU runs them."""
    from test_gpu import world2_sweep

    results = launch(2, world2_sweep, "cpu", timeout=600)
    failures = [f for rank_failures, _ in results for f in rank_failures]
    assert results[0][1] > 1000
    assert not failures, f"{len(failures)} wrong cases, first: " + "\n".join(failures[:10])
