"""Communicator: ring collectives on torch tensors, numpy arrays and cupy arrays."""
import threading

from . import _C, cpu_backend
from .buffers import as_buffer
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
        self._closed = False
        self._backend("cpu", -1)  # set up eagerly: set-up errors show here, not mid-training

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, tensor, op="sum"):
        """Reduces ``tensor`` over all ranks in place; every rank gets the same result.

        Example::

            comm.all_reduce(grad, op="avg")
        """
        buf = self._writable(tensor, "tensor")
        c_op = self._op(op, buf)
        self._run(buf, "all_reduce", buf.address, buf.numel, buf.c_dtype, c_op)
        return tensor

    def reduce_scatter(self, output, input, op="sum"):
        """Reduces ``input`` (world_size x output.numel() elements) over ranks; rank r gets block r.

        Example::

            comm.reduce_scatter(out, torch.ones(comm.world_size * out.numel()))
        """
        out, inp = self._writable(output, "output"), as_buffer(input, "input")
        self._same_kind(out, inp)
        self._sizes(inp.numel, out.numel * self.world_size, "input", "world_size x output")
        self._aliasing(out, inp, inp.element_address(self.rank * out.numel))
        c_op = self._op(op, out)
        self._run(out, "reduce_scatter", out.address, inp.address, out.numel, out.c_dtype, c_op)
        return output

    def all_gather(self, output, input):
        """Concatenates every rank's ``input`` into ``output`` (world_size x input.numel()).

        Example::

            comm.all_gather(torch.empty(comm.world_size * 4), torch.full((4,), comm.rank))
        """
        out, inp = self._writable(output, "output"), as_buffer(input, "input")
        self._same_kind(out, inp)
        self._sizes(out.numel, inp.numel * self.world_size, "output", "world_size x input")
        self._aliasing(out, inp, out.element_address(self.rank * inp.numel), inp_inside_out=True)
        self._run(out, "all_gather", out.address, inp.address, inp.numel, out.c_dtype)
        return output

    def broadcast(self, tensor, src=0):
        """Copies rank ``src``'s ``tensor`` into ``tensor`` on every rank.

        Example::

            comm.broadcast(weights, src=0)
        """
        buf = self._writable(tensor, "tensor")
        self._root(src, "src")
        self._run(buf, "broadcast", buf.address, buf.numel, buf.c_dtype, src)
        return tensor

    def reduce(self, tensor, dst=0, op="sum"):
        """Reduces ``tensor`` over ranks into ``tensor`` on rank ``dst``; others keep theirs.

        Example::

            comm.reduce(loss_sum, dst=0)
        """
        buf = self._writable(tensor, "tensor")
        self._root(dst, "dst")
        c_op = self._op(op, buf)
        self._run(buf, "reduce", buf.address, buf.numel, buf.c_dtype, c_op, dst)
        return tensor

    def gather(self, output, input, dst=0):
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
        self._run(inp, "gather", address, inp.address, inp.numel, inp.c_dtype, dst)
        return output

    def scatter(self, output, input, src=0):
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
        self._run(out, "scatter", out.address, address, out.numel, out.c_dtype, src)
        return output

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Releases shared memory and device resources; the communicator cannot be used after."""
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
            if device != "cpu":
                raise NotImplementedError("ringcomm's CUDA path is not available in this build")
            comm = cpu_backend.create(self._rendezvous, self._slice_bytes)
            self._backends[key] = comm
        return comm

    def _run(self, buf, name, *args):
        with self._lock:
            comm = self._backend(buf.device, buf.device_index)
            getattr(comm, name)(*args)

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
