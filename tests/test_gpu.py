"""GPU tests: the reduction kernels against exact references, and the NCCL ring on 2 and 4 ranks.

They need ringcomm built with CUDA and a visible GPU; everywhere else they skip. Several ranks
share one GPU (tests/support/launcher.py's shared_gpu_env: ringcomm.transport.cuda.shared_gpu_env).
RINGCOMM_TEST_WORLDS (default "2,4") picks the world sizes of the multi-rank tests.

Starting ranks on a GPU costs 10-15 s (interpreters, torch, a CUDA context each, NCCL's first
connection), so the multi-rank tests of a session share one launch per world size
(tests/support/shared_launch.py): each test's work runs there as a check, and the test asserts on its
check's outcome. RINGCOMM_TEST_LAUNCH_TIMEOUT bounds each launch, RINGCOMM_TEST_LAUNCH_LOG
records what each launch and check took.
"""
import os

import pytest
from launcher import shared_gpu_env
from shared_launch import SharedLaunches, on_ranks, shares_launch  # noqa: F401  (a fixture)

torch = pytest.importorskip("torch")

try:
    from ringcomm import _C, CommOptions, _testing
    from ringcomm.transport import cuda as cuda_backend
    from ringcomm.options import DEFAULTS
    from sweep import DTYPES as SWEEP_DTYPES, OPS, op_valid
except ImportError:  # not built: every test here skips
    _C, OPS, SWEEP_DTYPES = None, [], []

HAS_CUDA = _C is not None and hasattr(_C, "cuda_available") and _C.cuda_available()
if _C is not None:  # raw collectives: a CollectiveRequest each, Communicator.run
    R, P = _C.CollectiveRequest, _C.Collective
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not HAS_CUDA or not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU and ringcomm built with CUDA")]

WORLDS = [int(w) for w in os.environ.get("RINGCOMM_TEST_WORLDS", "2,4").split(",") if w]
# Every wait of a test's ring: short, so that a hang costs a test seconds, not minutes.
RING_TIMEOUT = float(os.environ.get("RINGCOMM_TEST_RING_TIMEOUT", "20"))

# The C++ table's dtypes by name (tests/support/sweep.py reads it).
DTYPES = {str(dtype).removeprefix("torch."): dtype for dtype in SWEEP_DTYPES}
FLOATS = {name for name, dtype in DTYPES.items() if dtype.is_floating_point}
COUNTS = [0, 1, 7, 1000, (1 << 20) + 3]

# Every op the C++ table defines for the dtype (tests/support/sweep.py reads it).
CASES = [(d, o) for d in DTYPES for o in OPS if op_valid(o, DTYPES[d])]


# -- kernel references ---------------------------------------------------------------------------

def _random(dtype, n, gen):
    t = DTYPES[dtype]
    if dtype == "bool":
        return torch.randint(0, 2, (n,), generator=gen, device="cuda").bool()
    if dtype in FLOATS:
        x = torch.randn(n, generator=gen, device="cuda", dtype=torch.float64) * 4
        if n > 2:
            x[1] = float("nan")  # NaN must win min/max, as on the CPU
            x[2] = 0.0
        return x.to(t)
    info = torch.iinfo(t)
    lo, hi = max(info.min, -(2 ** 62)), min(info.max, 2 ** 62)
    return torch.randint(lo, hi, (n,), generator=gen, device="cuda", dtype=torch.int64).to(t)


def _reference(dtype, op, a, b, divisor, finalize):
    """The CPU reducer's result (csrc/cpu/cpu_reducer.cc: the same op_math.h arithmetic, which
    tests/support/sweep.py checks on CPU): the kernels must match it, so a new op needs no edit here."""
    a, b = a.cpu(), b.cpu()
    out = torch.empty_like(a)
    _testing.cpu_reduce(out.data_ptr(), 0, a.data_ptr(), b.data_ptr(), a.numel(),
                          getattr(_C.DataType, dtype), getattr(_C.RedOp, op), divisor, finalize)
    return out.to("cuda")


def _run_kernel(dtype, op, out0, out1, a, b, n, divisor=1, finalize=False):
    stream = torch.cuda.current_stream().cuda_stream
    _testing.reduce_kernel(out0.data_ptr() if out0 is not None else 0,
                             out1.data_ptr() if out1 is not None else 0,
                             a.data_ptr(), b.data_ptr(), n, getattr(_C.DataType, dtype),
                             getattr(_C.RedOp, op), divisor, finalize, stream,
                             nccl_sms=DEFAULTS["nccl_sms"])


def _assert_same(actual, expected, what):
    if actual.dtype.is_floating_point:
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=what)
    else:
        assert torch.equal(actual, expected), what


@pytest.mark.parametrize("dtype,op", CASES)
def test_reduce_kernel_exact(dtype, op):
    gen = torch.Generator(device="cuda").manual_seed(1234)
    pad = 16
    for n in COUNTS:
        a_all, b_all = _random(dtype, n + pad, gen), _random(dtype, n + pad, gen)
        for off in range(8):
            # Same misalignment everywhere (vector body after a peeled head), then b shifted
            # by one more element (the all-scalar path).
            for b_off in (off, (off + 1) % 8):
                a, b = a_all[off:off + n], b_all[b_off:b_off + n]
                out_all = torch.zeros(n + pad, dtype=DTYPES[dtype], device="cuda")
                out1_all = torch.zeros_like(out_all)
                out0, out1 = out_all[off:off + n], out1_all[(off + 3) % 8:(off + 3) % 8 + n]
                finalize = op == "avg"
                _run_kernel(dtype, op, out0, out1 if off % 2 else None, a, b, n, 3, finalize)
                torch.cuda.synchronize()
                want = _reference(dtype, op, a, b, 3, finalize)
                what = f"{dtype} {op} n={n} offsets a={off} b={b_off}"
                _assert_same(out0, want, what)
                if off % 2:
                    _assert_same(out1, want, what + " (second output)")
                # Guards around the output are untouched.
                assert not out_all[:off].any() and not out_all[off + n:].any(), what


@pytest.mark.parametrize("dtype", sorted(FLOATS))
def test_reduce_kernel_in_place(dtype):
    gen = torch.Generator(device="cuda").manual_seed(7)
    n = 4099
    a, b = _random(dtype, n, gen), _random(dtype, n, gen)
    want = _reference(dtype, "avg", a, b, 4, True)
    _run_kernel(dtype, "avg", a, None, a, b, n, divisor=4, finalize=True)  # a = op(a, b)
    torch.cuda.synchronize()
    _assert_same(a, want, f"{dtype} in-place avg")


# -- float32 buffers on a 16-bit wire -------------------------------------------------------------
# a and out0 are float32, b and out1 the wire dtype; the CPU reducer is the reference, bit for bit.

WIRES = ["float16", "bfloat16"]
WIRE_OPS = [op for op in OPS if op_valid(op, torch.float32)]  # a wire carries float32 data


def _wire_inputs(n, gen):
    """float32 values with the awkward cases: NaN, +-inf, -0, fp16 overflow and subnormals,
    and values exactly half-way between two float16/bfloat16 neighbours."""
    x = (torch.randn(n, generator=gen, device="cuda") * 4).float()
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 7e4, -7e4,
                            3e-6, -1e-7, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
                            1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 65520.0, 6e-8],
                           device="cuda")
    k = min(n, special.numel())
    positions = torch.randperm(n, generator=gen, device="cuda")[:k]
    x[positions] = special[:k]
    return x


def _bits(t):
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()]).cpu()


def _assert_bits(actual, expected, what, nan_bits=True):
    """Same bits; with nan_bits=False a NaN only has to be a NaN (GPU arithmetic writes a
    canonical NaN where the CPU propagates the input's payload)."""
    nan = torch.isnan(expected.cpu().float())
    assert torch.equal(torch.isnan(actual.cpu().float()), nan), what + " (NaN positions)"
    a, e = _bits(actual), _bits(expected)
    if not nan_bits:
        a, e = a[~nan], e[~nan]
    if not torch.equal(a, e):
        i = int((a != e).nonzero()[0])
        raise AssertionError(f"{what}: first difference at {i}: {a[i]:#x} != {e[i]:#x}")


def _cpu_wire_reduce(op, out0, out1, a, b, n, divisor, finalize, wire):
    """The CPU reducer on host tensors (out0/a float32, out1/b in `wire`)."""
    try:
        _testing.cpu_reduce(out0.data_ptr() if out0 is not None else 0,
                              out1.data_ptr() if out1 is not None else 0,
                              a.data_ptr(), b.data_ptr(), n, _C.DataType.float32,
                              getattr(_C.RedOp, op), divisor, finalize,
                              wire_dtype=getattr(_C.DataType, wire))
    except TypeError:
        pytest.skip("the CPU reducer takes no wire_dtype in this build")


def _run_wire_kernel(op, out0, out1, a, b, n, wire, divisor=1, finalize=False):
    stream = torch.cuda.current_stream().cuda_stream
    _testing.reduce_kernel(out0.data_ptr() if out0 is not None else 0,
                             out1.data_ptr() if out1 is not None else 0,
                             a.data_ptr(), b.data_ptr(), n, _C.DataType.float32,
                             getattr(_C.RedOp, op), divisor, finalize, stream,
                             wire_dtype=getattr(_C.DataType, wire), nccl_sms=DEFAULTS["nccl_sms"])


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("op", WIRE_OPS)
def test_wire_reduce_kernel_matches_cpu(wire, op):
    gen = torch.Generator(device="cuda").manual_seed(99)
    wt = DTYPES[wire]
    pad = 16
    exact_nan = op in ("min", "max")  # these return an input NaN itself
    finalize = op == "avg"
    for n in COUNTS:
        a_all = _wire_inputs(n + pad, gen)
        b_all = _wire_inputs(n + pad, gen).to(wt)
        # Same element offset everywhere: vectors after a peeled head; b one further: scalar.
        for off, b_off in ((0, 0), (3, 3), (5, 5), (2, 3), (1, 0)):
            a, b = a_all[off:off + n], b_all[b_off:b_off + n]
            for outputs in ("both", "out0", "out1"):
                out0_all = torch.zeros(n + pad, device="cuda")
                out1_all = torch.zeros(n + pad, dtype=wt, device="cuda")
                out0 = out0_all[off:off + n] if outputs != "out1" else None
                out1 = out1_all[off:off + n] if outputs != "out0" else None
                _run_wire_kernel(op, out0, out1, a, b, n, wire, 3, finalize)
                torch.cuda.synchronize()

                ca, cb = a.cpu(), b.cpu()
                c0 = torch.zeros(n) if out0 is not None else None
                c1 = torch.zeros(n, dtype=wt) if out1 is not None else None
                _cpu_wire_reduce(op, c0, c1, ca, cb, n, 3, finalize, wire)
                what = f"{wire} wire {op} n={n} offsets a={off} b={b_off} {outputs}"
                if out0 is not None:
                    _assert_bits(out0, c0, what + " out0", exact_nan)
                if out1 is not None:
                    _assert_bits(out1, c1, what + " out1", exact_nan)
                if outputs == "both":  # the kept value is the one the other ranks receive
                    _assert_bits(out0, out1.float(), what + " out0 == out1", nan_bits=False)
                assert not out0_all[:off].any() and not out0_all[off + n:].any(), what
                assert not out1_all[:off].any() and not out1_all[off + n:].any(), what


@pytest.mark.parametrize("wire", WIRES)
def test_wire_reduce_kernel_in_place(wire):
    gen = torch.Generator(device="cuda").manual_seed(5)
    wt = DTYPES[wire]
    n = 4099
    a = (torch.randn(n, generator=gen, device="cuda") * 4).float()
    b = (torch.randn(n, generator=gen, device="cuda") * 4).to(wt)
    c0, c1 = a.cpu().clone(), b.cpu().clone()
    _cpu_wire_reduce("avg", c0, c1, c0, c1, n, 4, True, wire)
    _run_wire_kernel("avg", a, b, a, b, n, wire, divisor=4, finalize=True)  # a, b = op(a, b)
    torch.cuda.synchronize()
    _assert_bits(a, c0, f"{wire} in-place avg out0")
    _assert_bits(b, c1, f"{wire} in-place avg out1")


def test_wire_reduce_kernel_rejects_bad_combinations():
    x = torch.zeros(8, device="cuda")
    h = torch.zeros(8, dtype=torch.float16, device="cuda")
    with pytest.raises(RuntimeError, match="16-bit wire"):
        _run_wire_kernel("sum", x, h, x, h, 8, "int32")
    i = torch.zeros(8, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="cannot travel"):
        _testing.reduce_kernel(i.data_ptr(), 0, i.data_ptr(), h.data_ptr(), 8,
                                 _C.DataType.int32, _C.RedOp.sum, wire_dtype=_C.DataType.float16,
                                 nccl_sms=DEFAULTS["nccl_sms"])


@pytest.mark.parametrize("wire", WIRES)
def test_convert_kernel(wire):
    gen = torch.Generator(device="cuda").manual_seed(11)
    wt = DTYPES[wire]
    stream = torch.cuda.current_stream().cuda_stream
    cwire = getattr(_C.DataType, wire)
    pad = 16
    for n in COUNTS:
        f_all = _wire_inputs(n + pad, gen)
        w_all = _wire_inputs(n + pad, gen).to(wt)
        for off, src_off in ((0, 0), (3, 3), (2, 1)):
            what = f"{wire} n={n} offsets out={off} src={src_off}"
            # float32 -> wire: out1 rounded to nearest even, out0 a copy.
            src = f_all[src_off:src_off + n]
            o0_all, o1_all = torch.zeros(n + pad, device="cuda"), torch.zeros(n + pad, dtype=wt,
                                                                                device="cuda")
            o0, o1 = o0_all[off:off + n], o1_all[off:off + n]
            _testing.convert_kernel(o0.data_ptr(), o1.data_ptr(), src.data_ptr(), False, n,
                                      cwire, stream, nccl_sms=DEFAULTS["nccl_sms"])
            torch.cuda.synchronize()
            _assert_bits(o0, src, what + " to wire, out0")
            _assert_bits(o1, src.cpu().to(wt), what + " to wire, out1", nan_bits=False)
            assert not o1_all[:off].any() and not o1_all[off + n:].any(), what

            # wire -> float32: out0 widened (exact), out1 a copy.
            src = w_all[src_off:src_off + n]
            o0_all.zero_()
            o1_all.zero_()
            _testing.convert_kernel(o0.data_ptr(), o1.data_ptr(), src.data_ptr(), True, n,
                                      cwire, stream, nccl_sms=DEFAULTS["nccl_sms"])
            torch.cuda.synchronize()
            _assert_bits(o1, src, what + " from wire, out1")
            _assert_bits(o0, src.cpu().float(), what + " from wire, out0", nan_bits=False)
            assert not o0_all[:off].any() and not o0_all[off + n:].any(), what

    # Outputs that are the source itself are left alone; the other one is still written.
    x = torch.randn(1001, device="cuda")
    h = torch.empty(1001, dtype=wt, device="cuda")
    _testing.convert_kernel(x.data_ptr(), h.data_ptr(), x.data_ptr(), False, 1001, cwire,
                              stream, nccl_sms=DEFAULTS["nccl_sms"])
    torch.cuda.synchronize()
    _assert_bits(h, x.to(wt), f"{wire} convert with out0 == src")


def test_reduce_kernel_rejects_bad_combinations():
    x = torch.zeros(4, device="cuda")
    with pytest.raises(RuntimeError, match="only defined for integer"):
        _run_kernel("float32", "band", x, None, x, x, 4)


def test_copy_kernel():
    src = torch.arange(1001, dtype=torch.uint8, device="cuda")
    a, b = torch.zeros_like(src), torch.zeros_like(src)
    _testing.copy_kernel(a.data_ptr(), b.data_ptr(), src.data_ptr() + 1, 1000,
                           torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(a[:1000], src[1:]) and torch.equal(b[:1000], src[1:])


def test_nccl_loads_and_makes_ids():
    path, version = _C.nccl_library(**cuda_backend.nccl_search())
    assert version >= 20700 and path
    assert len(_C.nccl_unique_id(**cuda_backend.nccl_search())) == 128


# -- multi-rank ----------------------------------------------------------------------------------

def _on_ring(rank, world, body, **params):
    """A check: body(comm, ring, rank, world, store, **params) on a CUDA ring over GPU 0 (the
    store is the check's own: keys cannot meet another check's)."""
    torch.cuda.set_device(0)
    store = torch.distributed.distributed_c10d._get_default_store()
    # 1 MiB slices: ranks time-slice one GPU, so fewer, larger messages. NCCL: found by the
    # search and the wheel's folder, whatever RINGCOMM_NCCL_LIBRARY says.
    options = CommOptions(timeout=RING_TIMEOUT, slice_bytes=SLICE_BYTES,
                          nccl_library="").resolved(world)
    if rank == 0:
        store.set("ringcomm-nccl-id", _C.nccl_unique_id(**cuda_backend.nccl_search(options)))
    uid = store.get("ringcomm-nccl-id")
    ring = _C.CudaTransportAndReducer(rank, world, 0, uid,
                       **cuda_backend.ring_arguments(options, publish_bytes=PUBLISH_BYTES))
    comm = _C.Communicator(rank, world, ring.transport, ring.reducer, SLICE_BYTES)
    try:
        return body(comm, ring, rank, world, store, **params)
    finally:
        comm.close()
        ring.release()


@pytest.fixture(scope="session")
def shared_launches(request):
    """spawn, not fork: the parent may have initialised CUDA; the ranks share GPU 0."""
    return SharedLaunches(request.session, start_method="spawn", env=shared_gpu_env)


def _values(rank, n, dtype):
    """Small integers: every sum, avg and max is exact in every dtype."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i % 7) + rank + 1).to(dtype)


def _expected(op, world, n, dtype):
    stack = torch.stack([_values(r, n, torch.float64) for r in range(world)])
    if op == "sum":
        r = stack.sum(0)
    elif op == "avg":
        r = stack.sum(0) / world
        if not dtype.is_floating_point:
            r = torch.div(stack.sum(0), world, rounding_mode="trunc")
    elif op == "max":
        r = stack.max(0).values
    elif op == "min":
        r = stack.min(0).values
    else:
        r = stack.prod(0)
    return r.to(dtype)


# Up to ~64 K elements plus one ~1 M (ranks share one GPU, time-sliced); 1 M + 3 spans several
# 1 MiB slices, and the odd counts give chunks that end off the 16-byte grid.
COLLECTIVE_COUNTS = [0, 1, 7, 1000, 65539, (1 << 20) + 3]
SLICE_BYTES = 1 << 20
PUBLISH_BYTES = 1 << 20  # publications of the one-hop algorithms (CudaTransportAndReducer offers none by default)
REDUCE_CASES = [("float32", "sum"), ("bfloat16", "sum"), ("float16", "avg"), ("int32", "sum"),
                ("int64", "max"), ("float32", "prod"), ("float64", "min"), ("int8", "avg")]


def _all_collectives(comm, ring, rank, world, store):
    stream = torch.cuda.current_stream().cuda_stream
    for n in COLLECTIVE_COUNTS:
        for name, op in REDUCE_CASES:
            dt, cdt, cop = DTYPES[name], getattr(_C.DataType, name), getattr(_C.RedOp, op)
            x = _values(rank, n, dt)
            comm.run(R(P.all_reduce, x.data_ptr(), 0, n, cdt, cop, stream=stream))
            _assert_same(x, _expected(op, world, n, dt), f"all_reduce {name} {op} n={n}")

            big = torch.cat([_values(rank, n, dt) for _ in range(world)])
            out = torch.empty(n, dtype=dt, device="cuda")
            comm.run(R(P.reduce_scatter, out.data_ptr(), big.data_ptr(), n, cdt, cop,
                       stream=stream))
            _assert_same(out, _expected(op, world, n, dt), f"reduce_scatter {name} {op} n={n}")

            root = world - 1
            y = _values(rank, n, dt)
            comm.run(R(P.reduce, y.data_ptr(), 0, n, cdt, cop, root, stream=stream))
            if rank == root:
                _assert_same(y, _expected(op, world, n, dt), f"reduce {name} {op} n={n}")

        dt, cdt = torch.float32, _C.DataType.float32
        mine = _values(rank, n, dt)
        everyone = torch.cat([_values(r, n, dt) for r in range(world)])
        out = torch.full((world * n,), -1.0, device="cuda")
        comm.run(R(P.all_gather, out.data_ptr(), mine.data_ptr(), n, cdt, stream=stream))
        _assert_same(out, everyone, f"all_gather n={n}")

        src = 1 % world
        z = _values(rank, n, dt)
        comm.run(R(P.broadcast, z.data_ptr(), 0, n, cdt, root=src, stream=stream))
        _assert_same(z, _values(src, n, dt), f"broadcast n={n}")

        out = torch.full((world * n,), -1.0, device="cuda")
        comm.run(R(P.gather, out.data_ptr(), mine.data_ptr(), n, cdt, root=0, stream=stream))
        if rank == 0:
            _assert_same(out, everyone, f"gather n={n}")

        piece = torch.full((n,), -1.0, device="cuda")
        comm.run(R(P.scatter, piece.data_ptr(), everyone.data_ptr() if rank == src else 0, n,
                   cdt, root=src, stream=stream))
        _assert_same(piece, _values(rank, n, dt), f"scatter n={n}")
    ring.synchronize(60.0)


def _wire_all_reduce(comm, ring, rank, world, store):
    """float32 all_reduce on a 16-bit wire: exact for small integers, and every rank ends with
    the same bits (what the ring sent) for arbitrary values."""
    stream = torch.cuda.current_stream().cuda_stream
    for wire in WIRES:
        cwire = getattr(_C.DataType, wire)
        for n in COLLECTIVE_COUNTS:
            for op in ("sum", "avg", "max", "min"):
                x = _values(rank, n, torch.float32)
                comm.run(R(P.all_reduce, x.data_ptr(), 0, n, _C.DataType.float32,
                           getattr(_C.RedOp, op), wire_dtype=cwire, stream=stream))
                want = _expected(op, world, n, torch.float32)
                if op == "avg":  # the quotient is rounded to the wire like everything sent
                    want = want.to(DTYPES[wire]).float()
                _assert_same(x, want, f"{wire} wire all_reduce {op} n={n}")

            gen = torch.Generator(device="cuda").manual_seed(1000 + rank)
            x = torch.randn(n, generator=gen, device="cuda")
            comm.run(R(P.all_reduce, x.data_ptr(), 0, n, _C.DataType.float32, _C.RedOp.sum,
                       wire_dtype=cwire, stream=stream))
            everyone = torch.empty(world * n, device="cuda")
            comm.run(R(P.all_gather, everyone.data_ptr(), x.data_ptr(), n, _C.DataType.float32,
                       stream=stream))
            for r in range(world):
                _assert_bits(everyone[r * n:(r + 1) * n], x,
                             f"{wire} wire sum n={n}: rank {r} differs from rank {rank}")
            assert torch.equal(x.to(DTYPES[wire]).float(), x), "results are wire values"
    ring.synchronize(60.0)


@shares_launch(_on_ring, _wire_all_reduce)
@pytest.mark.parametrize("world", WORLDS)
def test_wire_all_reduce(world, on_ranks):
    on_ranks.values()


def _stream_semantics(comm, ring, rank, world, store):
    """Work queued before the collective on a side stream is seen; work after sees the result;
    the same holds when the collective is captured in a CUDA graph and replayed."""
    n = (1 << 22) + 5
    side = torch.cuda.Stream()
    x = torch.empty(n, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the collective must wait for this fill
        x.fill_(rank + 1.0)
        comm.run(R(P.all_reduce, x.data_ptr(), 0, n, _C.DataType.float32,
                   stream=side.cuda_stream))
        y = x * 2
    side.synchronize()
    total = world * (world + 1) / 2
    assert torch.all(y == 2 * total), "stream order broken"

    # query() answers for eager work even when the latest collective was captured in a graph.
    slow = torch.cuda.Stream()
    with torch.cuda.stream(slow):
        torch.cuda._sleep(2_000_000_000)  # ~1 s: still running after the capture below
        comm.run(R(P.all_reduce, x.data_ptr(), 0, n, _C.DataType.float32,
                   stream=slow.cuda_stream))

    g = torch.cuda.CUDAGraph()
    buf = torch.zeros(1000, device="cuda")
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        # capture_begin, not `with torch.cuda.graph(g)`: that synchronizes the whole device
        # first, which would finish the eager all_reduce that query() is checked against.
        g.capture_begin()
        comm.run(R(P.all_reduce, buf.data_ptr(), 0, 1000, _C.DataType.float32,
                   stream=capture.cuda_stream))
        g.capture_end()
    torch.cuda.current_stream().wait_stream(capture)
    assert not ring.query(), "the eager all_reduce behind the sleep is still running"
    ring.synchronize(60.0)
    assert ring.query()
    for value in (1.0, 2.0):
        buf.fill_(value * (rank + 1))
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(buf == value * total), f"graph replay with {value}"

    # A replay on one stream beside an eager collective on another: they share the staging slots
    # and the NCCL communicator, so they run one after the other, in launch order.
    other = torch.empty(n, device="cuda")
    replaying, eager = torch.cuda.Stream(), torch.cuda.Stream()
    for round_ in range(3):
        buf.fill_(rank + 1.0 + round_)
        other.fill_(2.0 * (rank + 1))
        torch.cuda.synchronize()
        with torch.cuda.stream(replaying):
            g.replay()
        comm.run(R(P.all_reduce, other.data_ptr(), 0, n, _C.DataType.float32, _C.RedOp.sum,
                   stream=eager.cuda_stream))
        torch.cuda.synchronize()
        assert torch.all(buf == total + world * round_), f"replay beside eager, round {round_}"
        assert torch.all(other == 2 * total), f"eager beside a replay, round {round_}"

    # Tagged and repeated on the same buffers, a collective is recorded at its second call and
    # replayed by the later ones (cuda_graphs): every round exact, on the current stream.
    bucket = torch.empty((3 << 20) + 7, device="cuda")
    current = torch.cuda.current_stream()
    for round_ in range(5):
        bucket.fill_(rank + 1.0 + round_)
        comm.run(R(P.all_reduce, bucket.data_ptr(), 0, bucket.numel(), _C.DataType.float32,
                   stream=current.cuda_stream, replay_tag=0))
        twice = bucket * 2  # ordered after the collective on the same stream
        torch.cuda.synchronize()
        assert torch.all(twice == 2 * (total + world * round_)), f"repeated, round {round_}"


def _timeout(comm, ring, rank, world, store):
    """A rank that stops calling makes the other time out with an error naming its peers."""
    x = torch.ones(1 << 20, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    # Together first: NCCL connects peers lazily, and connecting needs both sides.
    comm.run(R(P.all_reduce, x.data_ptr(), 0, x.numel(), _C.DataType.float32, stream=stream))
    ring.synchronize(60.0)
    if rank == 0:
        try:
            comm.run(R(P.all_reduce, x.data_ptr(), 0, x.numel(), _C.DataType.float32,
                       stream=stream))
            with pytest.raises(RuntimeError, match="did not finish.*rank 0 of 2.*rank 1"):
                ring.synchronize(5.0)
        finally:  # also when the check fails here: rank 1 must not wait out the launch
            store.set("rank0-done", b"1")
    else:
        store.get("rank0-done")
        ring.abort("test over")


@shares_launch(_on_ring, _all_collectives)
@pytest.mark.parametrize("world", WORLDS)
def test_every_collective(world, on_ranks):
    on_ranks.values()


@shares_launch(_on_ring, _stream_semantics)
@pytest.mark.parametrize("world", WORLDS[:1])
def test_stream_semantics_and_graphs(world, on_ranks):
    on_ranks.values()


@shares_launch(_on_ring, _timeout, world=2)
def test_timeout_names_peers(on_ranks):
    on_ranks.values()


def test_missing_peer_times_out_at_creation():
    """An NCCL init whose peer never joins: the owner's wait times out, aborts and raises instead
    of hanging."""
    uid = _C.nccl_unique_id(**cuda_backend.nccl_search())
    with pytest.raises(_C.CommTimeoutError, match="creating the NCCL communicator.*rank 0 of 2"):
        _C.CudaTransportAndReducer(0, 2, 0, uid,
                    **cuda_backend.ring_arguments(CommOptions(timeout=5.0).resolved(2)))


def _api_all_reduce(rank, world):
    torch.cuda.set_device(0)
    import ringcomm

    comm = ringcomm.Communicator()
    t = torch.full((1001,), rank + 1.0, device="cuda")
    try:
        comm.all_reduce(t)
    except NotImplementedError:
        return "SKIP"
    torch.cuda.synchronize()
    assert torch.all(t == world * (world + 1) / 2)
    comm.close()


@shares_launch(_api_all_reduce, world=WORLDS[0])
def test_python_api_on_cuda_tensors(on_ranks):
    """The public API on CUDA tensors, once ringcomm.Communicator supports them."""
    results = on_ranks.values()
    if all(r == "SKIP" for r in results):
        pytest.skip("ringcomm.Communicator does not support CUDA tensors yet")
    assert "SKIP" not in results, results


# -- point to point and all-to-all over the ring's NCCL communicator ---------------------------

P2P_COUNTS = [0, 1, 7, 1000, (1 << 20) + 3]


def _split_matrix(world, seed):
    """counts[r][p]: what rank r sends rank p (uneven, with zeros)."""
    gen = torch.Generator().manual_seed(seed)
    choices = torch.tensor([0, 0, 1, 3, 7, 1000, 65539])
    return choices[torch.randint(0, len(choices), (world, world), generator=gen)].tolist()


def _block(src, dst, n, dtype):
    """What rank src sends rank dst: distinct integers per pair, exact in every dtype."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i % 11) + 13 * src + dst).to(dtype)


def _point_to_point(comm, ring, rank, world, store):
    comm.set_peer_links(ring.transport)
    stream = torch.cuda.current_stream().cuda_stream
    for n in P2P_COUNTS:
        for name in ("float32", "int64", "bfloat16"):
            dt, cdt = DTYPES[name], getattr(_C.DataType, name)
            # Pairs that meet: even ranks send first, odd ranks receive first (NCCL's rule).
            for shift in sorted({1, world - 1}):
                to, frm = (rank + shift) % world, (rank - shift) % world
                out = _block(rank, to, n, dt)
                got = torch.full((n,), -1, dtype=dt, device="cuda")
                calls = [lambda: comm.send(out.data_ptr(), n, cdt, to, 5, stream),
                         lambda: comm.recv(got.data_ptr(), n, cdt, frm, 5, stream)]
                for call in calls if rank % 2 == 0 else calls[::-1]:
                    call()
                _assert_same(got, _block(frm, rank, n, dt), f"send/recv {name} n={n} shift={shift}")
    for seed in range(3):
        counts = _split_matrix(world, seed)
        send = [counts[rank][p] for p in range(world)]
        recv = [counts[p][rank] for p in range(world)]
        for name in ("float32", "int32"):
            dt, cdt = DTYPES[name], getattr(_C.DataType, name)
            inp = torch.cat([_block(rank, p, send[p], dt) for p in range(world)])
            out = torch.full((sum(recv),), -1, dtype=dt, device="cuda")
            comm.all_to_all(out.data_ptr(), inp.data_ptr(), send, recv, cdt, stream)
            expected = torch.cat([_block(p, rank, recv[p], dt) for p in range(world)])
            _assert_same(out, expected, f"all_to_all {name} seed={seed} {send} -> {recv}")
    ring.synchronize(60.0)


@shares_launch(_on_ring, _point_to_point)
@pytest.mark.parametrize("world", WORLDS)
def test_point_to_point_and_all_to_all(world, on_ranks):
    on_ranks.values()


def _api_point_to_point(rank, world):
    """ringcomm.Communicator on torch (and cupy) CUDA tensors, and the torch backend."""
    torch.cuda.set_device(0)
    import torch.distributed as dist

    import ringcomm

    comm = ringcomm.Communicator()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    x, got = _block(rank, nxt, 1001, torch.float32), torch.zeros(1001, device="cuda")
    pair = [lambda: comm.send(x, nxt, tag=3), lambda: comm.recv(got, prev, tag=3)]
    for call in pair if rank % 2 == 0 else pair[::-1]:
        call()
    # Every rank sends first, to both neighbours, messages beyond NCCL's buffers: one NCCL group
    # per rank, so no order waits (at world 2 both neighbours are one rank: two messages each way).
    big = (4 << 20) + 3
    from_prev, from_nxt = torch.zeros(big, device="cuda"), torch.zeros(big, device="cuda")
    comm.batch_isend_irecv([ringcomm.P2POp("send", _block(rank, nxt, big, torch.float32), nxt),
                            ringcomm.P2POp("send", _block(rank, prev, big, torch.float32) + 0.5,
                                           prev),
                            ringcomm.P2POp("recv", from_prev, prev),
                            ringcomm.P2POp("recv", from_nxt, nxt)])
    splits = [p + 1 for p in range(world)]  # rank p sends every rank p + 1 rows of 2
    inp = torch.cat([_block(rank, p, 2 * (rank + 1), torch.int64) for p in range(world)])
    out = torch.empty(sum(2 * (p + 1) for p in range(world)), dtype=torch.int64, device="cuda")
    comm.all_to_all(out.view(-1, 2), inp.view(-1, 2), splits, [rank + 1] * world)
    torch.cuda.synchronize()
    _assert_same(got, _block(prev, rank, 1001, torch.float32), "Communicator send/recv")
    _assert_same(from_prev, _block(prev, rank, big, torch.float32), "batch from the previous rank")
    _assert_same(from_nxt, _block(nxt, rank, big, torch.float32) + 0.5, "batch from the next rank")
    _assert_same(out, torch.cat([_block(p, rank, 2 * (p + 1), torch.int64) for p in range(world)]),
                 "Communicator all_to_all")
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        a = cupy.arange(world * 3, dtype=cupy.float32) + 100 * rank
        b = cupy.empty_like(a)
        comm.all_to_all(b, a)
        cupy.cuda.get_current_stream().synchronize()
        expected = cupy.concatenate([cupy.arange(3 * rank, 3 * rank + 3, dtype=cupy.float32)
                                     + 100 * p for p in range(world)])
        assert bool((b == expected).all())
    comm.close()

    group = dist.new_group(backend="ringcomm")
    t = torch.arange(4 * world, device="cuda", dtype=torch.float32) + 10 * rank
    o = torch.empty_like(t)
    dist.all_to_all_single(o, t, group=group)
    expected = torch.cat([torch.arange(4 * rank, 4 * rank + 4, device="cuda") + 10.0 * p
                          for p in range(world)])
    _assert_same(o, expected, "backend all_to_all_single")
    m = torch.full((5,), float(rank), device="cuda")
    r = torch.empty(5, device="cuda")
    ops = [lambda: dist.send(m, nxt, group=group), lambda: dist.recv(r, prev, group=group)]
    for call in ops if rank % 2 == 0 else ops[::-1]:
        call()
    # torch's batch_isend_irecv, sends listed first on every rank: one NCCL group per rank.
    sent, into = torch.full((big,), float(rank), device="cuda"), torch.empty(big, device="cuda")
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, sent, nxt, group),
                                    dist.P2POp(dist.irecv, into, prev, group)])
    for work in works:
        work.wait()
    torch.cuda.synchronize()
    _assert_same(r, torch.full((5,), float(prev), device="cuda"), "backend send/recv")
    _assert_same(into, torch.full((big,), float(prev), device="cuda"), "backend batch_isend_irecv")
    dist.destroy_process_group(group)


@shares_launch(_api_point_to_point, world=WORLDS[0])
def test_python_point_to_point_on_cuda(on_ranks):
    on_ranks.values()


# -- one-hop algorithms: publications over NCCL -------------------------------------------------

def _publication_rounds(comm, ring, rank, world, store):
    """The transport's publications straight, as a one-hop plan drives them: rounds back to
    back with no host wait between them (both phases, parities alternating, zero bytes, the
    largest publication, and uneven sizes declared up front as two_shot's chunks would be);
    every rank's data lands where it belongs."""
    stream = torch.cuda.current_stream().cuda_stream
    rounds = []
    sizes = [[n] * world for n in (1, 1000, 0, PUBLISH_BYTES // 4, 7, 65539)]
    sizes += [[(1000 + r) // world for r in range(world)], [1] + [0] * (world - 1)]
    for k, counts in enumerate(sizes):
        phases = 1 + k % 2
        sources = [_values(rank * 10 + 2 * k + p, counts[rank], torch.int32)
                   for p in range(phases)]
        outputs = [[torch.full((c,), -1, dtype=torch.int32, device="cuda") for c in counts]
                   for _ in range(phases)]
        _testing.publication_round(ring, rank, stream, [s.data_ptr() for s in sources],
                                     [4 * c for c in counts],
                                     [[o.data_ptr() for o in row] for row in outputs])
        rounds.append((k, counts, sources, outputs))
    torch.cuda.synchronize()
    ring.synchronize(60.0)
    for k, counts, _, outputs in rounds:
        for p, row in enumerate(outputs):
            for owner, out in enumerate(row):
                _assert_same(out, _values(owner * 10 + 2 * k + p, counts[owner], torch.int32),
                             f"round {k} phase {p}: rank {owner}'s publication, {counts}")


@shares_launch(_on_ring, _publication_rounds)
@pytest.mark.parametrize("world", WORLDS)
def test_publication_rounds(world, on_ranks):
    on_ranks.values()


def _one_hop_all_reduce(comm, ring, rank, world, store, name):
    """Exact sums (and avg, max, min, prod) with a one-hop algorithm against the same reference
    as the ring; float results have the same bits on every rank. Returns why it did not run
    (this build has no such algorithm, or the core refuses it on NCCL), else None."""
    if name not in _C.Algorithm.__members__:
        return f"this build has no {name}"
    stream = torch.cuda.current_stream().cuda_stream
    algorithm = _C.Algorithm.__members__[name]
    try:
        x = _values(rank, 8, torch.float32)
        comm.run(R(P.all_reduce, x.data_ptr(), 0, 8, _C.DataType.float32, algorithm=algorithm,
                   stream=stream))
    except _C.RingcommError as e:
        if "needs" in str(e):
            return str(e)
        raise
    for n in [0, 1, 7, world - 1, 1000, 65539]:
        for dtype_name, op in REDUCE_CASES:
            dt, cdt = DTYPES[dtype_name], getattr(_C.DataType, dtype_name)
            x = _values(rank, n, dt)
            comm.run(R(P.all_reduce, x.data_ptr(), 0, n, cdt, getattr(_C.RedOp, op),
                       algorithm=algorithm, stream=stream))
            _assert_same(x, _expected(op, world, n, dt), f"{name} {dtype_name} {op} n={n}")
        gen = torch.Generator(device="cuda").manual_seed(7 + rank)
        x = torch.randn(n, generator=gen, device="cuda")
        comm.run(R(P.all_reduce, x.data_ptr(), 0, n, _C.DataType.float32, algorithm=algorithm,
                   stream=stream))
        everyone = torch.empty(world * n, device="cuda")
        comm.run(R(P.all_gather, everyone.data_ptr(), x.data_ptr(), n, _C.DataType.float32,
                   stream=stream))
        for r in range(world):
            _assert_bits(everyone[r * n:(r + 1) * n], x,
                         f"{name} float sum n={n}: rank {r} differs from rank {rank}")
    ring.synchronize(60.0)
    return None


@shares_launch(_on_ring, _one_hop_all_reduce)
@pytest.mark.parametrize("name", ["one_shot", "two_shot"])
@pytest.mark.parametrize("world", WORLDS)
def test_one_hop_all_reduce_exact(world, name, on_ranks):
    refused = on_ranks.values()
    if refused[0]:
        pytest.skip(f"not run: {refused[0]}")


# -- the GPU check's first tests: every collective exact, then DDP and the torch backend ----------

def world2_sweep(rank, world, device="cuda"):
    """Every collective x dtype x op x awkward count through the public API on `device`
    tensors, against exact references, in one launch (tests/support/collective_checks.py, as on the
    CPU; tests/test_collectives.py runs this very function on the CPU)."""
    import ringcomm
    from collective_checks import VALID, Checker, counts_for
    from sweep import DTYPES as SWEEP_DTYPES

    if device == "cuda":
        torch.cuda.set_device(0)
    comm = ringcomm.Communicator(timeout=RING_TIMEOUT)
    checker = Checker(comm, device)
    for count in counts_for(world) + [65539]:
        for dtype, op in VALID:
            checker.reductions(count, dtype, op)
        for dtype in SWEEP_DTYPES:
            checker.copies(count, dtype)
    for dtype, op in [(torch.float32, "sum"), (torch.bfloat16, "avg"), (torch.int8, "max")]:
        checker.reductions((1 << 20) + 3, dtype, op)  # several slices, chunks off the 16 B grid
    checker.copies((1 << 20) + 3, torch.float32)
    comm.close()
    return checker.failures, checker.cases


@shares_launch(world2_sweep, world=2)
def test_world2_every_collective_dtype_op_exact_in_one_launch(on_ranks):
    results = on_ranks.values()
    failures = [f for rank_failures, _ in results for f in rank_failures]
    assert results[0][1] > 1000, results[0][1]
    assert not failures, f"{len(failures)} wrong cases, first: " + "\n".join(failures[:10])


def ddp_hook_against_stock(rank, world, device="cuda"):
    """A small model on `device`: stock DDP (gloo, the launcher's group) and DDP with
    ringcomm's allreduce_hook, from the same weights on the same data."""
    import ringcomm
    import ringcomm.ddp
    from torch.nn.parallel import DistributedDataParallel as DDP

    if device == "cuda":
        torch.cuda.set_device(0)
    comm = ringcomm.Communicator(timeout=RING_TIMEOUT)
    params = {}
    for name in ("stock", "ringcomm"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)).to(device)
        ddp = DDP(model, bucket_cap_mb=0.01)
        if name == "ringcomm":
            ddp.register_comm_hook(comm, ringcomm.ddp.allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(5):
            g = torch.Generator(device=device).manual_seed(100 * step + rank)
            x = torch.randn(16, 32, device=device, generator=g)
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
        params[name] = [p.detach().cpu() for p in model.parameters()]
    comm.close()
    return params


@shares_launch(ddp_hook_against_stock, world=2)
def test_ddp_hook_on_cuda_matches_stock_ddp(on_ranks):
    check_ddp_hook_against_stock(on_ranks.values())


def check_ddp_hook_against_stock(results):
    for rank, params in enumerate(results):
        for stock, ours in zip(params["stock"], params["ringcomm"]):
            assert torch.allclose(stock, ours, rtol=0, atol=1e-6), f"rank {rank}"


def backend_collectives(rank, world, device="cuda"):
    """A few collectives through dist.* on a "ringcomm" group, on `device` tensors."""
    import datetime

    import ringcomm  # noqa: F401  registers the backend
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(0)
    group = dist.new_group(backend="ringcomm", timeout=datetime.timedelta(seconds=RING_TIMEOUT))
    n = 1003
    t = torch.arange(n, device=device, dtype=torch.float32) + rank
    dist.all_reduce(t, group=group)
    out = {"all_reduce": t.cpu()}
    gathered = torch.empty(world * n, device=device)
    dist.all_gather_into_tensor(gathered, t, group=group)
    out["all_gather"] = gathered.cpu()
    mine = torch.empty(n, device=device)
    dist.reduce_scatter_tensor(mine, gathered, group=group)
    out["reduce_scatter"] = mine.cpu()
    b = torch.full((n,), float(rank), device=device)
    dist.broadcast(b, src=1, group=group)
    out["broadcast"] = b.cpu()
    if device == "cuda":
        torch.cuda.synchronize()
    dist.destroy_process_group(group)
    return out


@shares_launch(backend_collectives, world=2)
def test_torch_backend_on_cuda(on_ranks):
    check_backend_collectives(on_ranks.values())


def check_backend_collectives(results):
    n = 1003
    summed = 2 * torch.arange(n, dtype=torch.float32) + 1
    for out in results:
        assert torch.equal(out["all_reduce"], summed)
        assert torch.equal(out["all_gather"], torch.cat([summed, summed]))
        assert torch.equal(out["broadcast"], torch.ones(n))
    for rank, out in enumerate(results):
        assert torch.equal(out["reduce_scatter"], 2 * torch.cat([summed, summed])[rank * n:][:n])


def test_a_cuda_work_waits_on_the_gpu_not_the_host(tmp_path):
    """The torch backend's Work on CUDA tensors, as NCCL's (one rank, in pytest's process): the
    call is enqueued on the current stream, wait() orders the caller's current stream after it
    without blocking the host, is_completed() asks the GPU, and the Future carries the device."""
    import torch.distributed as dist

    import ringcomm  # noqa: F401  (registers the backend)

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("ringcomm", store=store, rank=0, world_size=1)
    try:
        _work_semantics(dist)
    finally:
        dist.destroy_process_group()


def _work_semantics(dist):
    import time

    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    # The first CUDA collective creates the NCCL communicator (seconds, on the host): done here,
    # it cannot outlast the sleep below and leave the Work complete before it is asked.
    dist.all_reduce(t)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # keeps the current stream busy for about a second
    work = dist.all_reduce(t, async_op=True)
    assert not work.is_completed(), "is_completed() must ask the GPU, which is still busy"
    begun = time.perf_counter()
    work.wait()
    assert time.perf_counter() - begun < 0.5, "wait() blocked the host"
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        work.get_future().wait()  # orders the side stream after the collective
        copy = t * 1
    torch.cuda.synchronize()
    assert work.is_completed() and work.is_success()
    assert torch.equal(copy, torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
    assert work.get_future().value()[0].device.type == "cuda"
