"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import _C, checks, cpu_backend, cuda_backend, work
from .buffers import as_buffer, as_c_dtype
from .rendezvous import Rendezvous

_P = _C.Primitive


class Communicator:
    """One rank's handle on ringcomm rings over a torch.distributed group.

    Call it on every rank after ``torch.distributed.init_process_group(...)``; rank, world size
    and the rendezvous store come from the group. Collectives run on the tensors' device: CPU
    tensors and numpy arrays over shared memory between the local processes.

    Args:
        group: a torch.distributed process group (default: the default group).
        timeout: a ``datetime.timedelta`` or seconds: the longest any wait may take
            (default: ``torch.distributed.default_pg_timeout``).
        slice_bytes: pipelining granularity (default: the transport's message size).
        debug: before every collective, compare what each rank is about to run (kind, count,
            dtype, op, root) with one small CPU all_gather and raise MismatchError on every
            rank if they differ. The CPU ring checks this on every message anyway; this mode is
            for CUDA, where NCCL carries no header. Costs one small collective per call
            (~10-100 us). Default: ``RINGCOMM_DEBUG`` is ``1`` or ``DETAIL``.
        check_finite: before every collective, look for NaN/Inf in each rank's input and, if
            any rank has one, raise FloatingPointError on every rank naming the rank and the
            first bad index. Default: ``RINGCOMM_CHECK_FINITE=1``.

    Example::

        dist.init_process_group("gloo")
        comm = ringcomm.Communicator()
        t = torch.ones(1000) * comm.rank
        comm.all_reduce(t)            # every rank: sum of all ranks' values
        comm.close()
    """

    def __init__(self, group=None, timeout=None, *, slice_bytes=None, debug=None, check_finite=None):
        # A Rendezvous is accepted in place of a group: from_store builds one without a group.
        self._rendezvous = group if isinstance(group, Rendezvous) else Rendezvous(group, timeout)
        self.rank = self._rendezvous.rank
        self.world_size = self._rendezvous.world_size
        self.timeout = self._rendezvous.timeout
        self._slice_bytes = slice_bytes
        self.debug = _env_flag("RINGCOMM_DEBUG", ("1", "DETAIL")) if debug is None else bool(debug)
        self.check_finite = _env_flag("RINGCOMM_CHECK_FINITE", ("1",)) if check_finite is None \
            else bool(check_finite)
        self._backends = {}
        self._lock = threading.Lock()
        self._worker = None  # runs async_op collectives on CPU, in order
        self._last = None
        self._closed = False
        if not cuda_backend.available():
            self._backend("cpu", -1)  # set up eagerly: set-up errors show here, not mid-training

    @classmethod
    def from_store(cls, store, rank, world_size, timeout=None, **options):
        """A communicator built from a ``torch.distributed.Store`` instead of a process group:
        no ``init_process_group`` needed (a torch backend's creator runs before it exists).
        Every rank calls it with the same store; keyword options as for the constructor.

        Example::

            store = dist.TCPStore("127.0.0.1", 29500, world_size, rank == 0)
            comm = ringcomm.Communicator.from_store(store, rank, world_size, timeout=60)
        """
        return cls(Rendezvous.from_store(store, rank, world_size, timeout), **options)

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, tensor, op="sum", *, async_op=False, wire_dtype=None):
        """Reduces ``tensor`` over all ranks in place; every rank gets the same result.

        ``wire_dtype`` (torch.bfloat16 or torch.float16, for float32 tensors) sends 16-bit
        messages while each hop still adds in float32 and the result stays float32.
        ``async_op=True`` returns a :class:`ringcomm.work.Work` (every collective takes it).

        Example::

            comm.all_reduce(grad, op="avg", wire_dtype=torch.bfloat16)
        """
        buf = checks.writable(tensor, "tensor")
        c_op = checks.reduce_op(op, buf)
        extra = {}
        if wire_dtype is not None and as_c_dtype(wire_dtype) != buf.c_dtype:
            extra["wire_dtype"] = as_c_dtype(wire_dtype)
        self._precheck("all_reduce", buf, c_op, 0, buf)
        return self._run(buf, "all_reduce", (buf.address, buf.numel, buf.c_dtype, c_op), tensor,
                         async_op, **extra)

    def reduce_scatter(self, output, input, op="sum", *, async_op=False):
        """Reduces ``input`` (world_size x output.numel() elements) over ranks; rank r gets block r.

        Example::

            comm.reduce_scatter(out, torch.ones(comm.world_size * out.numel()))
        """
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        checks.sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
        checks.aliasing(out, inp, inp.element_address(self.rank * out.numel))
        c_op = checks.reduce_op(op, out)
        self._precheck("reduce_scatter", out, c_op, 0, inp)
        return self._run(out, "reduce_scatter", (out.address, inp.address, out.numel, out.c_dtype, c_op),
                         output, async_op)

    def all_gather(self, output, input, *, async_op=False):
        """Concatenates every rank's ``input`` into ``output`` (world_size x input.numel()).

        Example::

            comm.all_gather(torch.empty(comm.world_size * 4), torch.full((4,), comm.rank))
        """
        out, inp = checks.writable(output, "output"), as_buffer(input, "input")
        checks.same_kind(out, inp)
        checks.sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
        checks.aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
        self._precheck("all_gather", inp, None, 0, inp)
        return self._run(out, "all_gather", (out.address, inp.address, inp.numel, out.c_dtype),
                         output, async_op)

    def broadcast(self, tensor, src=0, *, async_op=False):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        buf = checks.writable(tensor, "tensor")
        checks.root(src, "src", self.world_size)
        self._precheck("broadcast", buf, None, src, buf if self.rank == src else None)
        return self._run(buf, "broadcast", (buf.address, buf.numel, buf.c_dtype, src), tensor, async_op)

    def reduce(self, tensor, dst=0, op="sum", *, async_op=False):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        buf = checks.writable(tensor, "tensor")
        checks.root(dst, "dst", self.world_size)
        c_op = checks.reduce_op(op, buf)
        self._precheck("reduce", buf, c_op, dst, buf)
        return self._run(buf, "reduce", (buf.address, buf.numel, buf.c_dtype, c_op, dst), tensor,
                         async_op)

    def gather(self, output, input, dst=0, *, async_op=False):
        """Concatenates every rank's ``input`` into ``output`` on rank ``dst`` only.

        ``output`` (world_size x input.numel()) is used on ``dst`` and may be None elsewhere.

        Example::

            out = torch.empty(comm.world_size * 3) if comm.rank == 0 else None
            comm.gather(out, torch.full((3,), comm.rank), dst=0)
        """
        inp = as_buffer(input, "input")
        checks.root(dst, "dst", self.world_size)
        address = 0
        if self.rank == dst:
            if output is None:
                raise ValueError(f"gather needs an output tensor on dst rank {dst}")
            out = checks.writable(output, "output")
            checks.same_kind(out, inp)
            checks.sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
            checks.aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
            address = out.address
        self._precheck("gather", inp, None, dst, inp)
        return self._run(inp, "gather", (address, inp.address, inp.numel, inp.c_dtype, dst), output,
                         async_op)

    def scatter(self, output, input, src=0, *, async_op=False):
        """Rank ``src`` splits ``input`` (world_size x output.numel()) and rank r gets block r.

        ``input`` is used on ``src`` and may be None elsewhere.

        Example::

            inp = torch.arange(comm.world_size * 2.0) if comm.rank == 0 else None
            comm.scatter(torch.empty(2), inp, src=0)
        """
        out = checks.writable(output, "output")
        checks.root(src, "src", self.world_size)
        address = 0
        if self.rank == src:
            if input is None:
                raise ValueError(f"scatter needs an input tensor on src rank {src}")
            inp = as_buffer(input, "input")
            checks.same_kind(out, inp)
            checks.sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
            checks.aliasing(out, inp, inp.element_address(self.rank * out.numel))
            address = inp.address
        self._precheck("scatter", out, None, src, inp if self.rank == src else None)
        return self._run(out, "scatter", (out.address, address, out.numel, out.c_dtype, src), output,
                         async_op)

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Releases shared memory, device resources and the worker thread; idempotent."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)  # finishes queued async work first
            self._worker = None
        with self._lock:
            self._closed = True
            for comm in self._backends.values():
                comm.close()
            self._backends.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"{len(self._backends)} backend(s)"
        return f"ringcomm.Communicator(rank={self.rank}, world_size={self.world_size}, {state})"

    # -- helpers -------------------------------------------------------------------------------

    def _backend(self, device, index):
        if self._closed:
            raise _C.RingcommError("this ringcomm communicator is closed")
        key = (device, index)
        comm = self._backends.get(key)
        if comm is None:
            if device == "cpu":
                comm = cpu_backend.create(self._rendezvous, self._slice_bytes)
            else:
                comm = cuda_backend.create(self._rendezvous, index, self._slice_bytes)
            self._backends[key] = comm
        return comm

    def _precheck(self, name, buf, c_op, root, data):
        """Debug and NaN/Inf checks: one small all_gather over the CPU ring, so that every rank
        reaches the same verdict and raises together instead of leaving its peers waiting."""
        if not (self.debug or self.check_finite):
            return
        if self._last is not None:
            self._last.result()  # queued async collectives use the ring first
        first_bad = checks.first_non_finite(data) if self.check_finite and data is not None else -1
        kind = _C.Primitive.__members__[name]
        mine = torch.tensor([int(kind), buf.numel, int(buf.c_dtype),
                             -1 if c_op is None else int(c_op), root, first_bad], dtype=torch.int64)
        everyone = torch.empty(self.world_size * mine.numel(), dtype=torch.int64)
        self._call(_CPU_BUFFER, "all_gather", (everyone.data_ptr(), mine.data_ptr(), mine.numel(),
                                                _C.DataType.int64), {})
        rows = everyone.view(self.world_size, -1).tolist()
        if self.debug:
            fields = ("collective", "count", "dtype", "op", "root")
            differ = [r for r in range(self.world_size) if rows[r][:5] != rows[self.rank][:5]]
            if differ:
                described = "; ".join(
                    f"rank {r}: " + ", ".join(f"{f}={v}" for f, v in zip(fields, checks.describe_row(rows[r])))
                    for r in range(self.world_size))
                raise _C.MismatchError(f"{name}: ranks called different collectives ({described})")
        bad = [(r, row[5]) for r, row in enumerate(rows) if row[5] >= 0]
        if bad:
            where = ", ".join(f"rank {r} at index {i}" for r, i in bad)
            raise FloatingPointError(f"{name}: NaN or Inf in the input of {where}")

    def _call(self, buf, name, args, extra):
        with self._lock:
            comm = self._backend(buf.device, buf.device_index)
            if buf.device == "cuda":
                extra["stream"] = cuda_backend.current_stream(buf)
            getattr(comm, name)(*args, **extra)

    def _run(self, buf, name, args, result, async_op, **extra):
        """Runs a collective now, or (async_op on CPU) on the worker thread, in call order."""
        if buf.device == "cuda":  # already asynchronous: ordered on the caller's stream
            self._call(buf, name, args, extra)
            return work.completed(result, torch.device("cuda", buf.device_index)) if async_op else result
        if not async_op and (self._last is None or self._last.done()):
            self._call(buf, name, args, extra)
            return result
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="ringcomm")
        future = torch.futures.Future()

        def task():
            try:
                self._call(buf, name, args, extra)
                future.set_result(result)
            except Exception as error:  # delivered to whoever waits on the future
                future.set_exception(error)

        self._last = self._worker.submit(task)
        if not async_op:  # queued behind async work: keep the order, then wait
            return future.wait()
        return work.Work(future)


class _CpuOnly:
    device, device_index = "cpu", -1


_CPU_BUFFER = _CpuOnly()  # routes the checks' small all_gather to the CPU ring


def _env_flag(name, values):
    return os.environ.get(name, "").upper() in values
