"""Reliability with real processes: deadlines, killed peers, mismatched calls, bad input, leaks.

Each test is bounded in time by the launcher; assertions on elapsed times are generous bounds
on hangs (timeout + 5 s), not performance thresholds."""
import os
import re
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

import launcher
import ringcomm
from launcher import die_soon, launch
from shm_leaks import created_by, shm_entries

pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")


# -- deadlines -----------------------------------------------------------------------------------

def absent_peer(rank, n):
    comm = ringcomm.Communicator(timeout=2)
    if rank == 1:
        time.sleep(4)  # never joins this collective in time
        with pytest.raises(ringcomm.RingcommError):
            comm.all_reduce(torch.ones(10))  # the ring was aborted meanwhile: refuses at once
        return None
    start = time.monotonic()
    with pytest.raises(ringcomm.CommTimeoutError) as error:
        comm.all_reduce(torch.ones(10))
    return time.monotonic() - start, str(error.value)


def test_a_wait_past_the_timeout_names_collective_step_and_peer():
    elapsed, message = launch(2, absent_peer, timeout=60)[0]
    assert 2 <= elapsed < 2 + 5
    assert "all_reduce #0" in message and "rank 1" in message
    assert re.search(r"\(step \d+ of \d+, (slice|round) \d+ of \d+\)", message), message


# -- a killed peer -------------------------------------------------------------------------------

def killed_mid_collective(rank, n):
    comm = ringcomm.Communicator(timeout=60)
    store = dist.distributed_c10d._get_default_store()
    big = torch.ones(16 << 20)
    comm.all_reduce(big)  # warm: the ring works
    if rank == n - 1:
        die_soon(store)
    with pytest.raises(ringcomm.PeerError) as error:
        for _ in range(1000):
            comm.all_reduce(big)
    noticed = time.time()
    killed_at = float(store.get("killed_at"))
    with pytest.raises(ringcomm.PeerError, match="cannot be used again"):
        comm.all_reduce(torch.ones(3))
    comm.close()
    return noticed - killed_at, str(error.value)


def test_waiters_stop_yielding_when_yields_lose_the_core():
    """Beside busy processes a sched_yield hands the core away for a scheduler slice: 4 slow
    yields (> 500 us) in a window of 16 turn yielding off; fewer, or a window of fast ones in
    between, do not."""
    from ringcomm import _testing
    gate = _testing.YieldGate()
    for _ in range(3):
        gate.note_yield(5000)
    for _ in range(13):  # completes the window: the 3 slow ones are forgotten
        gate.note_yield(20)
    gate.note_yield(5000)
    assert gate.may_yield()
    for _ in range(2):
        gate.note_yield(5000)
    assert gate.may_yield() and not gate.yielding_is_off()  # 3 slow in this window
    assert gate.note_yield(600)  # the 4th turns yielding off
    assert gate.yielding_is_off() and not gate.may_yield()
    assert _testing.YieldGate().may_yield()  # a fresh gate starts with yielding on


def test_yielding_comes_back_once_probes_find_the_cores_free():
    """While yielding is off, one waiter per probe period may yield; a run of fast probes turns
    yielding on again, a slow one starts the run over and doubles the period (up to a cap), and
    waiters between probes sleep."""
    from ringcomm import _testing
    gate = _testing.YieldGate()
    first, last = gate.first_probe_seconds, gate.last_probe_seconds
    for _ in range(4):
        gate.note_yield(5000)
    assert gate.yielding_is_off() and gate.probe_period_seconds() == pytest.approx(first)

    def probe(micros):
        """Waits for the next probe (none comes before the period is up) and reports it."""
        period, start = gate.probe_period_seconds(), time.monotonic()
        while not gate.may_yield():
            assert time.monotonic() < start + 20 * last, "no probe came"
            time.sleep(first / 20)
        assert time.monotonic() - start >= 0.8 * period
        assert not gate.may_yield()  # one waiter probes, the others sleep on
        return gate.note_yield(micros)

    assert probe(20) and probe(20)  # two fast probes: still off
    expected = first
    while expected < last:
        assert probe(5000)  # a slow one: the run starts over, the period doubles
        expected = min(2 * expected, last)
        assert gate.probe_period_seconds() == pytest.approx(expected)
    assert probe(5000) and gate.probe_period_seconds() == pytest.approx(last)  # its cap
    for _ in range(gate.quiet_probes - 1):
        assert probe(20)
    assert not probe(20)  # quiet_probes fast ones in a row: yielding is on again
    assert not gate.yielding_is_off() and gate.may_yield()


def test_survivors_of_a_killed_rank_raise_promptly_and_refuse_further_use():
    n = 3
    results = launch(n, killed_mid_collective, timeout=120, allow_exit={n - 1})
    delays = [r[0] for r in results[:-1]]
    assert all(d < 5 for d in delays), f"survivors noticed after {delays} s (timeout was 60 s)"
    assert any(f"rank {n - 1}" in r[1] and "died" in r[1] for r in results[:-1]), results
    # Only the killed rank is ever said to have died (not the rank a survivor was waiting on).
    assert all(f"rank {n - 1} (process" in r[1] for r in results[:-1] if "died" in r[1]), results


# -- mismatched calls ----------------------------------------------------------------------------

MISMATCHES = {
    "count": lambda comm, r: comm.all_reduce(torch.ones(10 + r)),
    "dtype": lambda comm, r: comm.all_reduce(torch.ones(10, dtype=torch.float32 if r else torch.int32)),
    "op": lambda comm, r: comm.all_reduce(torch.ones(10), op="max" if r else "sum"),
    "root": lambda comm, r: comm.broadcast(torch.ones(10), src=r),
    "collective": lambda comm, r: comm.all_reduce(torch.ones(4)) if r else comm.broadcast(torch.ones(4)),
    "empty vs not": lambda comm, r: comm.all_reduce(torch.ones(5 * r)),
    "algorithm": lambda comm, r: comm.all_reduce(torch.ones(4), algorithm="one_shot" if r else "ring"),
}


def mismatched(rank, n, debug):
    outcomes = {}
    for name, call in MISMATCHES.items():
        comm = ringcomm.Communicator(timeout=20, debug=debug)
        start = time.monotonic()
        try:
            call(comm, rank if rank < 2 else 1)  # ranks >= 1 agree with each other
            # A rank whose part of the plan only matched its neighbours' finishes; the ranks
            # that noticed aborted the ring, so its next call must fail.
            comm.all_reduce(torch.ones(1))
            outcomes[name] = "no error"
        except ringcomm.RingcommError as error:
            outcomes[name] = (type(error).__name__, time.monotonic() - start, str(error))
        comm.close()
    # After all that, a fresh communicator works.
    with ringcomm.Communicator(timeout=20) as comm:
        t = comm.all_reduce(torch.ones(3))
        assert torch.equal(t, torch.full((3,), float(n)))
    return outcomes


@pytest.mark.parametrize("n,debug", [(2, False), (3, False), (3, True)])
def test_mismatched_collectives_fail_on_every_rank(n, debug):
    results = launch(n, mismatched, debug, timeout=240)
    for rank, outcomes in enumerate(results):
        for name, outcome in outcomes.items():
            assert outcome != "no error", f"rank {rank} ran mismatched '{name}' without error"
            kind, elapsed, message = outcome
            assert elapsed < 10, f"rank {rank} took {elapsed:.1f} s to notice '{name}'"
            assert kind in ("MismatchError", "PeerError"), (rank, name, message)
            if debug:  # the descriptor exchange stops every rank before any data moves
                assert kind == "MismatchError" and "different collectives" in message
    detecting = [o for r in results for o in r.values() if o[0] == "MismatchError"]
    assert any("collective mismatch" in m or "different collectives" in m for _, _, m in detecting)


def uneven_slot_counts(rank, n):
    # Ranks that disagree on slots per link run different waves of slice columns, so their
    # messages arrive in another order than expected: every message names its first element,
    # which turns that into an error instead of silently reducing the wrong slices.
    comm = ringcomm.Communicator(timeout=20, slot_count=4 if rank == 0 else 16)
    t = torch.ones(64 * comm.options.slot_bytes)  # many columns per chunk
    with pytest.raises((ringcomm.MismatchError, ringcomm.PeerError)) as error:
        comm.all_reduce(t)
    comm.close()
    return type(error.value).__name__, str(error.value)


def test_ranks_with_different_slot_counts_fail_instead_of_corrupting():
    results = launch(2, uneven_slot_counts, timeout=120)
    assert any(kind == "MismatchError" and "at element" in message
               for kind, message in results), results


# -- bad input -----------------------------------------------------------------------------------

def bad_inputs(rank, n):
    comm = ringcomm.Communicator(timeout=20)
    t = torch.arange(12, dtype=torch.float32)
    keep = t.clone()
    out4 = torch.zeros(4 * n)
    table = [
        (ValueError, "contiguous", lambda: comm.all_reduce(t.view(3, 4).t())),
        (TypeError, "does not support", lambda: comm.all_reduce(torch.ones(3, dtype=torch.int16))),
        (TypeError, "does not support", lambda: comm.all_reduce(torch.ones(3, dtype=torch.complex64))),
        (ringcomm.RingcommError, "only defined for integer", lambda: comm.all_reduce(t, op="band")),
        (ValueError, "unsupported reduction op", lambda: comm.all_reduce(t, op="mean")),
        (ValueError, "must have world_size", lambda: comm.reduce_scatter(torch.zeros(5), t)),
        (TypeError, "dtype", lambda: comm.reduce_scatter(torch.zeros(12 // n, dtype=torch.float64), t)),
        (ValueError, "must have world_size", lambda: comm.all_gather(torch.zeros(5), t)),
        (ValueError, "overlap", lambda: comm.all_gather(out4, out4[1:5])),
        (ValueError, "src=5", lambda: comm.broadcast(t, src=5)),
        (ValueError, "dst=-1", lambda: comm.reduce(t, dst=-1)),
        (ValueError, "output tensor on dst", lambda: comm.gather(None, t, dst=rank)),
        (ValueError, "read-only", lambda: comm.all_reduce(np.frombuffer(b"\0" * 16, dtype=np.float32))),
        (ValueError, "device meta", lambda: comm.all_reduce(torch.empty(3, device="meta"))),
        (TypeError, "torch.Tensor, numpy.ndarray", lambda: comm.all_reduce([1.0, 2.0])),
        (ringcomm.RingcommError, "cannot travel", lambda: comm.all_reduce(t.double(), wire_dtype=torch.float16)),
    ]
    for kind, text, call in table:
        with pytest.raises(kind, match=text):
            call()
        assert torch.equal(t, keep) and not out4.any(), f"'{text}' touched a buffer"
    comm.all_reduce(t)  # no rank sent anything for the bad calls: the ring is still in step
    assert torch.equal(t, keep * n)
    comm.close()
    with pytest.raises(ringcomm.RingcommError, match="closed"):
        comm.all_reduce(t)
    return len(table)


def test_bad_input_raises_before_communicating_and_touches_nothing():
    assert launch(2, bad_inputs, timeout=120) == [16, 16]


# -- nothing leaked ------------------------------------------------------------------------------

def create_close_many(rank, n):
    threads = threading.active_count()
    for i in range(100):
        comm = ringcomm.Communicator(timeout=20)
        comm.all_reduce(torch.ones(4), async_op=(i % 2 == 0)).wait() if i % 2 == 0 else comm.all_reduce(torch.ones(4))
        comm.close()
    assert threading.active_count() == threads, "close() left threads running"
    a, b = ringcomm.Communicator(timeout=20), ringcomm.Communicator(timeout=20)
    x, y = torch.ones(5), torch.full((7,), 2.0)
    a.all_reduce(x)
    b.all_reduce(y)
    a.all_reduce(x)
    assert torch.equal(x, torch.full((5,), float(n * n))) and torch.equal(y, torch.full((7,), 2.0 * n))
    a.close(), b.close()
    return shm_entries()


def test_create_close_100_times_and_two_side_by_side_leave_nothing():
    first = len(launcher.started_pids)
    for leftover in launch(2, create_close_many, timeout=240):
        assert created_by(leftover, set(launcher.started_pids[first:])) == []


def raise_midway(rank, n):
    comm = ringcomm.Communicator(timeout=3)
    if rank == 0:
        raise RuntimeError("user code fails before the collective")
    with pytest.raises(ringcomm.RingcommError):
        comm.all_reduce(torch.ones(8))
    return None


def test_an_exception_in_one_rank_leaves_no_segments():
    with pytest.raises(AssertionError, match="user code fails"):
        launch(2, raise_midway, timeout=60)


# -- NaN / Inf -----------------------------------------------------------------------------------

def non_finite(rank, n):
    comm = ringcomm.Communicator(timeout=20, check_finite=True)
    t = torch.ones(100)
    if rank == 1:
        t[7] = float("nan")
    with pytest.raises(FloatingPointError, match="rank 1 at index 7"):
        comm.all_reduce(t)
    assert torch.isnan(t).sum() == (rank == 1)  # nothing was reduced
    comm.all_reduce(torch.ones(3))  # and the ring is still in step
    comm.close()


def test_non_finite_check_names_rank_and_index_on_every_rank():
    launch(3, non_finite, timeout=60)


def test_names_left_by_a_killed_process_are_removed():
    """A process killed during set-up leaves its segments' names in /dev/shm; the next process
    that creates one removes those whose creator is gone and which are older than a minute,
    never a live process's, nor a young one (it may be another PID namespace's)."""
    import os
    import subprocess
    import time

    from ringcomm import _testing

    dead = subprocess.Popen(["true"])
    dead.wait()
    names = {"old_dead": f"ringcomm-{dead.pid}-r0-0-test",
             "young_dead": f"ringcomm-{dead.pid}-r0-1-test",
             "old_alive": f"ringcomm-{os.getpid()}-r0-2-test"}
    for key, name in names.items():
        with open(f"/dev/shm/{name}", "wb") as f:
            f.write(b"x")
        if key.startswith("old"):
            os.utime(f"/dev/shm/{name}", (time.time() - 3600, time.time() - 3600))
    try:
        assert _testing.remove_stale_segments(min_age_seconds=60) >= 1
        left = {key for key, name in names.items() if os.path.exists(f"/dev/shm/{name}")}
        assert left == {"young_dead", "old_alive"}
    finally:
        for name in names.values():
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")
