"""One collective call as the C++ core takes it: a :class:`CollectiveRequest` is built once per
call and carried as it is from the collective method to the ring."""
import numpy as np
import torch

from . import _C
from .buffers import NUMPY_C_DTYPES, TORCH_C_DTYPES

_SUM, _RING, _FLOAT32 = _C.RedOp.sum, _C.Algorithm.ring, _C.DataType.float32


class CollectiveRequest:
    """The fields of ``_C.CollectiveRequest``, in its order, as raw as it takes them: addresses of
    the buffers as integers (``input`` 0 for the collectives that run in place), counts in
    elements, ``_C`` enums. The stream is not one: it is the caller's when the request runs.

    A Python object, not the C++ one: building it costs a third as much, and the hot path hands
    its fields to the ring positionally (see :meth:`ringcomm.Communicator.try_run_now`).

    Example::

        C, t = ringcomm._C, torch.ones(2)
        request = CollectiveRequest(C.Collective.all_reduce, t.data_ptr(), 0, 2, C.DataType.float32)
    """

    # Slots and a plain __init__: one request is built per collective call.
    __slots__ = ("collective", "output", "input", "count", "dtype", "op", "root", "algorithm",
                 "wire_dtype")

    def __init__(self, collective, output=0, input=0, count=0, dtype=_FLOAT32, op=_SUM, root=0,
                 algorithm=_RING, wire_dtype=None):
        self.collective, self.output, self.input, self.count = collective, output, input, count
        self.dtype, self.op, self.root = dtype, op, root
        self.algorithm, self.wire_dtype = algorithm, wire_dtype

    def to_c(self, stream=0):
        """The ``_C.CollectiveRequest`` to run on `stream` (an integer; 0 on the CPU)."""
        return _C.CollectiveRequest(self.collective, self.output, self.input, self.count,
                                    self.dtype, self.op, self.root, self.algorithm,
                                    self.wire_dtype, stream)

    def __repr__(self):
        return repr(self.to_c())


def in_place_on_cpu(collective, array, op=_SUM, root=0, algorithm=_RING, wire_dtype=None):
    """The request of a collective that runs in place on `array` (all_reduce, broadcast) when
    `array` is a contiguous, writable CPU torch tensor or numpy array of a supported dtype, the
    common case, read with as few lookups as a small collective can afford; None for anything
    else, which the caller then checks as a :class:`ringcomm.buffers.Buffer` (and, if need be,
    rejects with a clear error)."""
    if isinstance(array, torch.Tensor):
        dtype = TORCH_C_DTYPES.get(array.dtype)
        if dtype is not None and array.is_cpu and array.is_contiguous():
            return CollectiveRequest(collective, array.data_ptr(), 0, array.numel(), dtype, op,
                                     root, algorithm, wire_dtype)
    elif isinstance(array, np.ndarray):
        dtype = NUMPY_C_DTYPES.get(array.dtype)
        flags = array.flags
        if dtype is not None and flags.c_contiguous and flags.writeable:
            return CollectiveRequest(collective, array.ctypes.data, 0, array.size, dtype, op,
                                     root, algorithm, wire_dtype)
    return None
