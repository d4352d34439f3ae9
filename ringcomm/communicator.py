"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from . import _C, cpu_backend, cuda_backend, work
from .buffers import as_buffer, as_c_dtype
from .ops import to_c_op
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

    Example::

        dist.init_process_group("gloo")
        comm = ringcomm.Communicator()
        t = torch.ones(1000) * comm.rank
        comm.all_reduce(t)            # every rank: sum of all ranks' values
        comm.close()
    """

    def __init__(self, group=None, timeout=None, *, slice_bytes=None):
        self._rendezvous = Rendezvous(group, timeout)
        self.rank = self._rendezvous.rank
        self.world_size = self._rendezvous.world_size
        self.timeout = self._rendezvous.timeout
        self._slice_bytes = slice_bytes
        self._backends = {}
        self._lock = threading.Lock()
        self._worker = None  # runs async_op collectives on CPU, in order
        self._last = None
        self._closed = False
        self._backend("cpu", -1)  # set up eagerly: set-up errors show here, not mid-training

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, tensor, op="sum", *, async_op=False, wire_dtype=None):
        """Reduces ``tensor`` over all ranks in place; every rank gets the same result.

        ``wire_dtype`` (torch.bfloat16 or torch.float16, for float32 tensors) sends 16-bit
        messages while each hop still adds in float32 and the result stays float32.
        ``async_op=True`` returns a :class:`ringcomm.work.Work` (every collective takes it).

        Example::

            comm.all_reduce(grad, op="avg", wire_dtype=torch.bfloat16)
        """
        buf = self._writable(tensor, "tensor")
        c_op = self._op(op, buf)
        extra = {}
        if wire_dtype is not None and as_c_dtype(wire_dtype) != buf.c_dtype:
            if buf.device == "cuda":
                raise NotImplementedError("a 16-bit wire_dtype is implemented on CPU only so far")
            extra["wire_dtype"] = as_c_dtype(wire_dtype)
        return self._run(buf, "all_reduce", (buf.address, buf.numel, buf.c_dtype, c_op), tensor,
                         async_op, **extra)

    def reduce_scatter(self, output, input, op="sum", *, async_op=False):
        """Reduces ``input`` (world_size x output.numel() elements) over ranks; rank r gets block r.

        Example::

            comm.reduce_scatter(out, torch.ones(comm.world_size * out.numel()))
        """
        out, inp = self._writable(output, "output"), as_buffer(input, "input")
        self._same_kind(out, inp)
        self._sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
        self._aliasing(out, inp, inp.element_address(self.rank * out.numel))
        c_op = self._op(op, out)
        return self._run(out, "reduce_scatter", (out.address, inp.address, out.numel, out.c_dtype, c_op),
                         output, async_op)

    def all_gather(self, output, input, *, async_op=False):
        """Concatenates every rank's ``input`` into ``output`` (world_size x input.numel()).

        Example::

            comm.all_gather(torch.empty(comm.world_size * 4), torch.full((4,), comm.rank))
        """
        out, inp = self._writable(output, "output"), as_buffer(input, "input")
        self._same_kind(out, inp)
        self._sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
        self._aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
        return self._run(out, "all_gather", (out.address, inp.address, inp.numel, out.c_dtype),
                         output, async_op)

    def broadcast(self, tensor, src=0, *, async_op=False):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        buf = self._writable(tensor, "tensor")
        self._root(src, "src")
        return self._run(buf, "broadcast", (buf.address, buf.numel, buf.c_dtype, src), tensor, async_op)

    def reduce(self, tensor, dst=0, op="sum", *, async_op=False):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        buf = self._writable(tensor, "tensor")
        self._root(dst, "dst")
        c_op = self._op(op, buf)
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
        self._root(dst, "dst")
        address = 0
        if self.rank == dst:
            if output is None:
                raise ValueError(f"gather needs an output tensor on dst rank {dst}")
            out = self._writable(output, "output")
            self._same_kind(out, inp)
            self._sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
            self._aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
            address = out.address
        return self._run(inp, "gather", (address, inp.address, inp.numel, inp.c_dtype, dst), output,
                         async_op)

    def scatter(self, output, input, src=0, *, async_op=False):
        """Rank ``src`` splits ``input`` (world_size x output.numel()) and rank r gets block r.

        ``input`` is used on ``src`` and may be None elsewhere.

        Example::

            inp = torch.arange(comm.world_size * 2.0) if comm.rank == 0 else None
            comm.scatter(torch.empty(2), inp, src=0)
        """
        out = self._writable(output, "output")
        self._root(src, "src")
        address = 0
        if self.rank == src:
            if input is None:
                raise ValueError(f"scatter needs an input tensor on src rank {src}")
            inp = as_buffer(input, "input")
            self._same_kind(out, inp)
            self._sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
            self._aliasing(out, inp, inp.element_address(self.rank * out.numel))
            address = inp.address
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

    def _writable(self, array, what):
        buf = as_buffer(array, what)
        if buf.readonly:
            raise ValueError(f"{what} is read-only, but the collective writes into it")
        return buf

    def _op(self, op, buf):
        c_op = to_c_op(op)
        _C.check_op(c_op, buf.c_dtype)
        return c_op

    def _root(self, root, name):
        if not isinstance(root, int) or not 0 <= root < self.world_size:
            raise ValueError(f"{name}={root!r} is not a rank of this {self.world_size}-rank communicator")

    @staticmethod
    def _same_kind(out, inp):
        if out.dtype != inp.dtype:
            raise TypeError(f"output has dtype {out.dtype} but input has {inp.dtype}; they must match")
        if (out.device, out.device_index) != (inp.device, inp.device_index):
            raise ValueError(f"output is on {out.device} but input is on {inp.device}; they must match")

    @staticmethod
    def _sizes(actual, expected, what, rule):
        if actual != expected:
            raise ValueError(f"{what} has {actual} elements but must have {rule} = {expected}")

    @staticmethod
    def _aliasing(out, inp, in_place_address, inp_inside_out=False):
        """Input and output may only overlap as the in-place form: this rank's block."""
        if not out.overlaps(inp):
            return
        small = inp if inp_inside_out else out
        if small.address == in_place_address:
            return
        raise ValueError("input and output overlap; the only overlap allowed is the in-place "
                         "form where the smaller one is exactly this rank's block of the larger")
