"""The Python surface: op names, options, build info, async handles, the 16-bit wire, the schedule
view."""
import dataclasses
import gc
import inspect
import os
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import torch
import torch.distributed as dist

import ringcomm
from launcher import launch
from ringcomm.buffers import as_buffer
from ringcomm.ops import to_reduce_op


def test_ops_accept_our_members_torch_members_and_names():
    assert to_reduce_op("sum") is ringcomm.ReduceOp.SUM
    assert to_reduce_op("MAX") is ringcomm.ReduceOp.MAX
    assert to_reduce_op(ringcomm.ReduceOp.BXOR) is ringcomm.ReduceOp.BXOR
    assert to_reduce_op(dist.ReduceOp.PRODUCT) is ringcomm.ReduceOp.PROD
    assert to_reduce_op(dist.ReduceOp.AVG) is ringcomm.ReduceOp.AVG
    for bad in ("add", 3, dist.ReduceOp.PREMUL_SUM):
        with pytest.raises(ValueError, match="unsupported reduction op"):
            to_reduce_op(bad)


def test_byte_swapped_numpy_arrays_are_refused_not_misread():
    # numpy names a big-endian float32 "float32" too; reduced as native floats it would be garbage.
    swapped = np.ones(3, dtype=np.dtype(np.float32).newbyteorder())
    with pytest.raises(TypeError, match="does not support"):
        as_buffer(swapped)
    assert as_buffer(np.ones(3, dtype=np.float32)).c_dtype == ringcomm._C.DataType.float32


def test_build_info_reports_cuda_and_archs():
    info = ringcomm.build_info()
    assert set(info) >= {"cuda", "cuda_archs", "nccl_version"}
    if info["cuda"]:
        assert "sm_90" in info["cuda_archs"] and info["nccl_version"].startswith("2.")
    else:
        assert info["cuda_archs"] == [] and info["nccl_version"] is None


def test_the_options_table_names_every_field_and_variable():
    """ringcomm/options.py's docstring is the one table of options (README and design.md point
    to it): a row per CommOptions field, with its environment variable."""
    rows = {}
    for line in ringcomm.options.__doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4:
            rows[cells[0]] = cells[1]
    fields = [f.name for f in dataclasses.fields(ringcomm.CommOptions)]
    assert sorted(set(rows) - {"field"}) == sorted(fields)
    for option in ringcomm.options.OPTIONS:
        assert rows[option.name].split()[0] == (option.environment or "-"), option.name


def test_the_algorithm_table_owns_the_thresholds(monkeypatch):
    """CommOptions' thresholds are the C++ algorithm table's (algorithms.h): a field and a
    RINGCOMM_ variable per algorithm auto picks by size, defaulting to the table's value, shown
    in the options table; the binding takes them by name and refuses names it does not have."""
    C = ringcomm._C
    defaults = dict(C.DEFAULT_THRESHOLDS)
    assert set(defaults) >= {"one_shot_max_bytes", "two_shot_max_bytes"}
    assert set(defaults) <= {f.name for f in dataclasses.fields(ringcomm.CommOptions)}
    for field in defaults:
        monkeypatch.delenv(f"RINGCOMM_{field.upper()}", raising=False)
    assert ringcomm.CommOptions(timeout=5).resolved(world_size=2).thresholds() == defaults
    monkeypatch.setenv("RINGCOMM_TWO_SHOT_MAX_BYTES", "4096")
    assert ringcomm.CommOptions(timeout=5).resolved(world_size=2).two_shot_max_bytes == 4096
    one_shot = defaults["one_shot_max_bytes"]
    assert f"| one_shot_max_bytes | RINGCOMM_ONE_SHOT_MAX_BYTES | {one_shot // 1024} KiB" in \
        ringcomm.options.__doc__
    P, A = C.Collective, C.Algorithm
    assert C.choose_algorithm(P.all_reduce, one_shot, 4) == A.one_shot  # the defaults
    two_shot = defaults["two_shot_max_bytes"]
    assert C.choose_algorithm(P.all_reduce, one_shot, 4, {"one_shot_max_bytes": 0}) == A.two_shot
    assert C.choose_algorithm(P.all_reduce, two_shot + 1, 4) == A.ring
    assert C.choose_algorithm(P.reduce_scatter, two_shot, 3) == A.one_shot
    assert C.choose_algorithm(P.all_reduce, one_shot + 1, 2) == A.ring  # 2 ranks: the ring's hops
    with pytest.raises(ringcomm.RingcommError, match="unknown threshold 'three_shot_max_bytes'"):
        C.choose_algorithm(P.all_reduce, 8, 4, {"three_shot_max_bytes": 1})


def test_options_resolve_explicit_then_environment_then_default(monkeypatch):
    for name in ("RINGCOMM_SHM_SLOTS", "RINGCOMM_SHM_SLOT_BYTES", "RINGCOMM_DEBUG", "RINGCOMM_ALGORITHM"):
        monkeypatch.delenv(name, raising=False)
    defaults = ringcomm.CommOptions(timeout=5).resolved(world_size=1)
    assert (defaults.slot_count, defaults.slot_bytes, defaults.debug) == (16, 64 << 10, False)
    assert defaults.algorithm == "auto" and defaults.timeout == 5.0
    crowded = ringcomm.CommOptions(timeout=5).resolved(world_size=os.cpu_count() + 1)
    assert (crowded.slot_count, crowded.slot_bytes, crowded.spin_us) == (8, 32 << 10, 0)
    monkeypatch.setenv("RINGCOMM_SHM_SLOTS", "4")
    monkeypatch.setenv("RINGCOMM_DEBUG", "detail")
    from_env = ringcomm.CommOptions(timeout=5).resolved(world_size=1)
    assert from_env.slot_count == 4 and from_env.debug is True
    explicit = ringcomm.CommOptions(timeout=5, slot_count=2, debug=False).resolved(world_size=1)
    assert explicit.slot_count == 2 and explicit.debug is False
    assert ringcomm.CommOptions(slot_count=2).replace(slot_count=None, spin_us=3).slot_count == 2
    monkeypatch.setenv("RINGCOMM_ALGORITHM", "tree")
    with pytest.raises(ValueError, match="unknown algorithm 'tree'"):
        ringcomm.CommOptions(timeout=5).resolved(world_size=1)


def test_communicator_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        ringcomm.Communicator()


def wire_and_async(rank, n):
    comm = ringcomm.Communicator(timeout=30)
    torch.manual_seed(rank)
    grads = torch.randn(10_000) * torch.logspace(-3, 3, 10_000)
    out = {}
    for wire in (torch.bfloat16, torch.float16):
        t = grads.clone()
        comm.all_reduce(t, op="avg", wire_dtype=wire)
        out[wire] = t
    # Async collectives run in call order, also behind and before synchronous ones.
    a, b = torch.full((5,), float(rank)), torch.full((7,), 1.0)
    w1 = comm.all_reduce(a, async_op=True)
    w2 = comm.all_reduce(b, op="max", async_op=True)
    c = comm.all_reduce(torch.ones(3))
    w1.wait()
    assert w2.get_future().wait() is b and w2.is_completed()
    assert torch.equal(a, torch.full((5,), float(sum(range(n)))))
    assert torch.equal(b, torch.ones(7)) and torch.equal(c, torch.full((3,), float(n)))
    with pytest.raises(ringcomm.RingcommError, match="cannot travel as"):
        comm.all_reduce(torch.ones(3, dtype=torch.float64), wire_dtype=torch.bfloat16)
    comm.close()
    return grads, out


def test_16_bit_wire_accumulates_in_float32_and_agrees_across_ranks():
    n = 3
    results = launch(n, wire_and_async)
    inputs = [r[0] for r in results]
    exact = torch.stack(inputs).double().sum(0) / n
    for wire in (torch.bfloat16, torch.float16):
        outputs = [r[1][wire] for r in results]
        assert all(torch.equal(outputs[0], o) for o in outputs[1:]), "ranks disagree"
        assert outputs[0].dtype == torch.float32
        # What rounding to 16 bits at every hop gives (torch's compress hooks' arithmetic).
        hop16 = inputs[0].to(wire) / n
        for x in inputs[1:]:
            hop16 = hop16 + x.to(wire) / n
        ours = (outputs[0].double() - exact).abs().sum()
        theirs = (hop16.double() - exact).abs().sum()
        assert ours < theirs, f"{wire}: ring error {ours} is not below 16-bit hops' {theirs}"


def numpy_calls(rank, n):
    comm = ringcomm.Communicator(timeout=30)
    summed = np.arange(6, dtype=np.int64) + rank
    comm.all_reduce(summed)
    copied = np.full(5, float(rank), dtype=np.float32)
    comm.broadcast(copied, src=1)
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.all_reduce(np.arange(8, dtype=np.int32).reshape(2, 4)[:, ::2])
    frozen = np.ones(3, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        comm.broadcast(frozen)
    with pytest.raises(TypeError, match=">f4, which ringcomm does not support"):
        comm.all_reduce(np.ones(3, dtype=np.dtype(np.float32).newbyteorder()))
    # Every dtype numpy shares with ringcomm (its address read in C++), and an empty array.
    maxima = {np.dtype(t).name: (np.arange(7) % 3 + rank).astype(t) for t in NUMPY_TYPES}
    for a in maxima.values():
        comm.all_reduce(a, op="max" if a.dtype != np.bool_ else "lor")
    comm.all_reduce(np.ones(0, dtype=np.float32))
    # Once the ring is set up, both collectives enter through builtins bound to it, which run
    # plain calls themselves and hand the rest to the method, as they came.
    assert type(comm.broadcast).__name__ == "builtin_function_or_method"
    assert str(inspect.signature(comm.broadcast)) == "(tensor, src=0, *, async_op=False)"
    by_value = np.full(4, rank + 1.0, dtype=np.float32)
    comm.all_reduce(by_value, ringcomm._C.RedOp.sum)
    tensor = torch.full((3,), float(rank))
    comm.broadcast(tensor, n - 1)
    comm.broadcast(tensor, src=n - 1, async_op=True).wait()  # handed on: a Work
    for bad in (n, -1, 1.0):
        with pytest.raises(ValueError, match=f"src={bad!r} is not a rank of this {n}-rank"):
            comm.broadcast(tensor, bad)
    with pytest.raises(TypeError, match="positional"):
        comm.broadcast(tensor, 0, False)
    comm.close()
    return summed, copied, maxima, by_value, tensor


NUMPY_TYPES = (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_)


def test_numpy_arrays_reduce_and_broadcast_exactly_and_bad_ones_are_refused():
    n = 2
    for summed, copied, maxima, by_value, tensor in launch(n, numpy_calls):
        assert by_value.tolist() == [n * (n + 1) / 2] * 4 and tensor.tolist() == [n - 1.0] * 3
        assert summed.tolist() == [n * i + sum(range(n)) for i in range(6)]
        assert copied.dtype == np.float32 and copied.tolist() == [1.0] * 5
        for t in NUMPY_TYPES:
            expected = (np.arange(7) % 3 + n - 1).astype(t)
            got = maxima[np.dtype(t).name]
            assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), t


def by_the_entry(call):
    """call()'s result, and whether it ran without entering the checked route (no Python frame
    of Router.run_in_place, through which the method runs every all_reduce)."""
    route, entered = ringcomm.routing.Router.run_in_place.__code__, []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code is route:
            entered.append(frame)
    sys.setprofile(watch)
    try:
        result = call()
    finally:
        sys.setprofile(None)
    return result, not entered


def entry_calls(rank, n):
    """all_reduce once the ring's entry is installed: what it runs itself, what it hands on."""
    comm = ringcomm.Communicator(timeout=30)
    first = np.full(3, rank + 1, dtype=np.int32)
    comm.all_reduce(first)  # the ring is set up by now: the entry takes the method's place
    entry = comm.all_reduce
    assert type(entry).__name__ == "builtin_function_or_method", entry
    assert str(inspect.signature(entry)) == str(inspect.signature(comm.__class__.all_reduce)
                                                ).replace("self, ", "")
    got = {"first": first}
    # Run by the entry itself: plain arrays and tensors, ops by name or _C member.
    got["numpy"] = comm.all_reduce(np.full(5, rank + 1.0, dtype=np.float64))
    got["tensor"] = comm.all_reduce(torch.full((7,), rank + 2, dtype=torch.int64), "max")
    got["c_op"] = comm.all_reduce(torch.full((2,), rank + 3.0), ringcomm._C.RedOp.min)
    # An algorithm by name, each the entry's own call: exact, and no Python frame on the way.
    for name in ringcomm.options.IN_HOST_ALGORITHMS:
        x = np.arange(11, dtype=np.float32) + rank
        got[f"by {name}"], direct = by_the_entry(
            lambda: comm.all_reduce(x, "sum", algorithm=name))
        assert direct, name
    _, direct = by_the_entry(lambda: comm.all_reduce(torch.ones(3), "SUM"))
    assert not direct  # the checked route, as the next calls
    with pytest.raises(ValueError, match="unknown algorithm 'rings'"):
        comm.all_reduce(np.ones(2, dtype=np.float32), algorithm="rings")
    # Handed to the checked route as they came: each still exact, or refused as before.
    got["upper"] = comm.all_reduce(torch.full((3,), 2.0), "SUM")
    got["enum"] = comm.all_reduce(torch.full((3,), rank + 5.0), ringcomm.ReduceOp.MAX)
    got["param"] = comm.all_reduce(torch.nn.Parameter(torch.ones(4), requires_grad=False))
    got["wire"] = comm.all_reduce(torch.ones(6), wire_dtype=torch.bfloat16)
    got["keywords"] = comm.all_reduce(tensor=np.ones(2), op="max", async_op=False, algorithm=None)
    work = comm.all_reduce(np.ones(4, dtype=np.float32), async_op=True)
    after = comm.all_reduce(np.ones(4, dtype=np.float32))  # waits behind the queued call
    work.wait()
    got["async"] = after
    with pytest.raises(ValueError, match="contiguous"):
        comm.all_reduce(torch.ones(4, 2).t())
    with pytest.raises(ValueError, match="unsupported reduction op 'plus'"):
        comm.all_reduce(np.ones(2, dtype=np.float32), "plus")
    # Arguments the method would refuse get the method's own errors.
    with pytest.raises(TypeError, match="positional"):
        entry(np.ones(2, dtype=np.float32), "sum", False)
    with pytest.raises(TypeError, match="unexpected keyword"):
        entry(np.ones(2, dtype=np.float32), bogus=1)
    with pytest.raises(TypeError, match="multiple values"):
        entry(np.ones(2, dtype=np.float32), "sum", op="max")
    assert comm.all_reduce is entry
    comm.close()
    assert comm.all_reduce != entry  # the method again
    with pytest.raises(ringcomm._C.RingcommError, match="closed"):
        comm.all_reduce(np.ones(2, dtype=np.float32))
    with pytest.raises(ringcomm._C.RingcommError, match="closed"):
        entry(np.ones(2, dtype=np.float32))
    # The entry holds its communicator weakly: a dropped communicator is freed, and an entry
    # kept beyond it says so.
    other = ringcomm.Communicator(timeout=30)
    other.all_reduce(np.ones(2))
    kept, gone = other.all_reduce, weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None
    with pytest.raises(ReferenceError, match="gone"):
        kept(np.ones(2), async_op=True)
    return {name: a.tolist() for name, a in got.items()}


def test_all_reduce_entry_runs_plain_calls_and_hands_the_rest_to_the_checked_route():
    n = 2
    for got in launch(n, entry_calls):
        assert got["first"] == [3] * 3 and got["numpy"] == [3.0] * 5
        assert got["tensor"] == [n + 1] * 7 and got["c_op"] == [3.0] * 2
        assert got["upper"] == [4.0] * 3 and got["enum"] == [n + 4.0] * 3
        assert got["param"] == [2.0] * 4 and got["wire"] == [2.0] * 6
        assert got["async"] == [2.0] * 4
        assert got["keywords"] == [1.0] * 2
        for name in ringcomm.options.IN_HOST_ALGORITHMS:
            assert got[f"by {name}"] == [2.0 * i + 1 for i in range(11)], name


def test_router_gate_is_a_lock_that_a_second_thread_waits_for():
    """The gate the entries take in C is the router's lock for Python too: `with`, acquire,
    release, and a second thread waits until the first lets go."""
    gate = ringcomm._C.RouterGate()
    assert not gate.locked() and gate.ring_open is False
    with pytest.raises(RuntimeError, match="unlocked"):
        gate.release()
    order = []

    def second():
        with gate:
            order.append("second")

    with gate:
        assert gate.locked()
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.2)  # long enough for the thread to block on the gate
        order.append("first")
    waiter.join(10)
    assert order == ["first", "second"] and not gate.locked()
    gate.ring_open = True
    assert gate.ring_open is True


def test_schedule_is_exported():
    s = ringcomm.schedule("all_gather", world_size=2, count=3)
    assert s.chunks == ((0, 3), (3, 3)) and len(s.steps) == 2


def float16_sums(rank, n):
    comm = ringcomm.Communicator(timeout=30)
    torch.manual_seed(rank)
    x = torch.randn(10_001) * 1000
    plain = x.half()
    comm.all_reduce(plain)
    wired = x.clone()
    comm.all_reduce(wired, wire_dtype=torch.float16)
    comm.close()
    return x, plain, wired


def test_float16_arithmetic_rounds_like_torch():
    """Real-valued inputs, 2 ranks: each element is one float32 addition, rounded once to
    float16 -- whichever conversion path (F16C or portable) the CPU takes."""
    results = launch(2, float16_sums, start_method="spawn")  # also covers the spawn path
    x0, x1 = results[0][0], results[1][0]
    expected_plain = (x0.half().float() + x1.half().float()).half()
    assert torch.equal(results[0][1], expected_plain) and torch.equal(results[1][1], expected_plain)
    # 16-bit wire: the chunk's owner adds its float32 value to the other's float16 message.
    chunks = ringcomm.schedule("all_reduce", world_size=2, count=x0.numel()).chunks
    expected_wire = torch.empty_like(x0)
    for owner, (offset, count) in enumerate(chunks):
        span = slice(offset, offset + count)
        own, other = (x0, x1) if owner == 0 else (x1, x0)
        expected_wire[span] = (own[span] + other[span].half().float()).half().float()
    assert torch.equal(results[0][2], expected_wire) and torch.equal(results[1][2], expected_wire)


def test_backends_are_registered_by_name_and_device():
    from ringcomm.transport import backends

    assert {(b.name, b.device) for b in backends.registered().values()} >= {
        ("shm+tcp", "cpu"), ("nccl", "cuda")}
    assert backends.for_device("cpu").stream(None) is None  # host: nothing to order on
    with pytest.raises(ValueError, match=r"no backend for xpu buffers.*shm\+tcp for cpu"):
        backends.for_device("xpu")
