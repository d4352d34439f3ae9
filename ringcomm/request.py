"""One collective call as the C++ core takes it: a :class:`CollectiveRequest` is built once per
checked call and carried as it is from the collective method to the ring."""
from typing import NamedTuple, Optional

from . import _C

_SUM, _RING, _FLOAT32 = _C.RedOp.sum, _C.Algorithm.ring, _C.DataType.float32


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

    def to_c(self, stream=0):
        """The ``_C.CollectiveRequest`` to run on `stream` (an integer; 0 on the CPU)."""
        return _C.CollectiveRequest(*self, stream)
