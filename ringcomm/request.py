"""One collective call as the C++ core takes it: a :class:`CollectiveRequest` is built once per
checked call, from the call's arguments once they are checked (the ``*_request`` functions of
the collectives that do not run in place), and carried as it is from the collective method to
the ring."""
from typing import NamedTuple, Optional

from . import _C, checks
from .buffers import as_buffer

_SUM, _RING, _FLOAT32 = _C.RedOp.sum, _C.Algorithm.ring, _C.DataType.float32
_Collective = _C.Collective


class CollectiveRequest(NamedTuple):
    """The fields of ``_C.CollectiveRequest``, in its order, as raw as it takes them: addresses of
    the buffers as integers (``input`` 0 for the collectives that run in place), counts in
    elements, ``_C`` enums. The stream is not one: it is the caller's when the request runs.

    A named tuple, cheaper to build than the C++ object, which :meth:`to_c` makes where a
    backend runs it; :meth:`ringcomm.Communicator.try_run_now` hands the fields to the ring as
    positional arguments instead.

    Example::

        C, t = ringcomm._C, torch.ones(2)
        request = CollectiveRequest(C.Collective.all_reduce, t.data_ptr(), 0, 2, C.DataType.float32)
    """

    collective: _C.Collective
    output: int = 0
    input: int = 0
    count: int = 0
    dtype: _C.DataType = _FLOAT32
    op: _C.RedOp = _SUM
    root: int = 0
    algorithm: _C.Algorithm = _RING
    wire_dtype: Optional[_C.DataType] = None

    def to_c(self, stream=0, replay_tag=-1):
        """The ``_C.CollectiveRequest`` to run on `stream` (an integer; 0 on the CPU), with the
        caller's replay tag (-1: none; see ``Communicator.all_reduce``)."""
        return _C.CollectiveRequest(*self, stream, replay_tag)


# Each returns the request and the Buffers the router takes: the one whose device runs it, then
# this rank's input (None: it has none). Arguments are checked first, so a bad call raises
# before any rank sends anything.

def reduce_scatter_request(output, input, op, algorithm, rank, world_size):
    out, inp = checks.writable(output, "output"), as_buffer(input, "input")
    checks.same_kind(out, inp)
    checks.sizes(inp.numel, out.numel * world_size, "input", "world_size x output")
    checks.aliasing(out, inp, inp.element_address(rank * out.numel))
    return CollectiveRequest(_Collective.reduce_scatter, out.address, inp.address, out.numel,
                             out.c_dtype, op, 0, algorithm), out, inp


def all_gather_request(output, input, algorithm, rank, world_size):
    out, inp = checks.writable(output, "output"), as_buffer(input, "input")
    checks.same_kind(out, inp)
    checks.sizes(out.numel, inp.numel * world_size, "output", "world_size x input")
    checks.aliasing(out, inp, out.element_address(rank * inp.numel), inp_inside_out=True)
    return CollectiveRequest(_Collective.all_gather, out.address, inp.address, inp.numel,
                             out.c_dtype, _SUM, 0, algorithm), out, inp


def reduce_request(tensor, dst, op, world_size):
    buf = checks.writable(tensor, "tensor")
    checks.root(dst, "dst", world_size)
    return CollectiveRequest(_Collective.reduce, buf.address, 0, buf.numel, buf.c_dtype, op,
                             dst), buf, buf


def gather_request(output, input, dst, rank, world_size):
    """`output` is used on rank `dst` only."""
    inp = as_buffer(input, "input")
    checks.root(dst, "dst", world_size)
    address = 0
    if rank == dst:
        if output is None:
            raise ValueError(f"gather needs an output tensor on dst rank {dst}")
        out = checks.writable(output, "output")
        checks.same_kind(out, inp)
        checks.sizes(out.numel, inp.numel * world_size, "output", "world_size x input")
        checks.aliasing(out, inp, out.element_address(rank * inp.numel), inp_inside_out=True)
        address = out.address
    return CollectiveRequest(_Collective.gather, address, inp.address, inp.numel, inp.c_dtype,
                             _SUM, dst), inp, inp


def scatter_request(output, input, src, rank, world_size):
    """`input` is used on rank `src` only."""
    out = checks.writable(output, "output")
    checks.root(src, "src", world_size)
    inp, address = None, 0
    if rank == src:
        if input is None:
            raise ValueError(f"scatter needs an input tensor on src rank {src}")
        inp = as_buffer(input, "input")
        checks.same_kind(out, inp)
        checks.sizes(inp.numel, out.numel * world_size, "input", "world_size x output")
        checks.aliasing(out, inp, inp.element_address(rank * out.numel))
        address = inp.address
    return CollectiveRequest(_Collective.scatter, out.address, address, out.numel, out.c_dtype,
                             _SUM, src), out, inp
