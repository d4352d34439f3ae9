"""What a collective needs to know of an array: address, length, dtype, device.

Accepts torch tensors, numpy arrays and anything with the CUDA array interface (cupy)."""
import numpy as np
import torch

from . import _C

# The C++ table's names (csrc/include/ringcomm/types.h) are torch's and numpy's names too.
_C_DTYPES = dict(_C.DataType.__members__)
_ITEMSIZES = {name: _C.dtype_size(c) for name, c in _C_DTYPES.items()}
_C_INFO = {name: (c, _ITEMSIZES[name]) for name, c in _C_DTYPES.items()}
_TORCH_DTYPES = {getattr(torch, name): name for name in _C_DTYPES}
# torch and numpy dtype -> _C.DataType: what a request read straight from an array looks up.
TORCH_C_DTYPES = {t: _C_DTYPES[name] for t, name in _TORCH_DTYPES.items()}
_NUMPY_DTYPES = {np.dtype(name): name for name in _C_DTYPES if hasattr(np, name)}
_NAMES_NUMPY_LACKS = {name: name for name in _C_DTYPES if not hasattr(np, name)}
NUMPY_C_DTYPES = {dtype: _C_DTYPES[name] for dtype, name in _NUMPY_DTYPES.items()}
# The CUDA array interface names dtypes as numpy does ("<f4"): it has none for what numpy lacks.
_TYPESTR_DTYPES = {dtype.str: name for dtype, name in _NUMPY_DTYPES.items()}
# Those with NaN and Inf: what check_finite looks at.
FLOATING = frozenset(name for name, c in _C_DTYPES.items() if _C.dtype_is_floating(c))


class Buffer:
    """A contiguous array seen as raw memory."""

    # Slots and a plain __init__: one Buffer is built per array per collective.
    __slots__ = ("address", "numel", "dtype", "device", "device_index", "readonly", "source",
                 "c_dtype", "itemsize")

    def __init__(self, address, numel, dtype, device, device_index, readonly, source):
        self.address, self.numel, self.source = address, numel, source
        self.dtype = dtype  # a key of _C.DataType
        self.device, self.device_index = device, device_index  # "cpu" (index -1) or "cuda"
        self.readonly = readonly
        self.c_dtype, self.itemsize = _C_INFO[dtype]

    @property
    def nbytes(self):
        return self.numel * self.itemsize

    def element_address(self, index):
        return self.address + index * self.itemsize

    def overlaps(self, other):
        if self.numel == 0 or other.numel == 0 or self.device != other.device:
            return False
        return self.address < other.address + other.nbytes and other.address < self.address + self.nbytes


def _unsupported(what, dtype):
    names = ", ".join(_C_DTYPES)
    return TypeError(f"{what} has dtype {dtype}, which ringcomm does not support (use one of {names})")


def _from_torch(t, what):
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise _unsupported(what, t.dtype)
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous (call .contiguous() first)")
    if t.is_cuda:
        return Buffer(t.data_ptr(), t.numel(), dtype, "cuda", t.get_device(), False, t)
    if not t.is_cpu:
        raise ValueError(f"{what} is on device {t.device}; ringcomm supports cpu and cuda tensors")
    return Buffer(t.data_ptr(), t.numel(), dtype, "cpu", -1, False, t)


def _from_numpy(a, what):
    # By dtype, not a.dtype.name (numpy builds the name anew, ~2 us): that also refuses
    # byte-swapped arrays. Names only for what numpy lacks (ml_dtypes' bfloat16).
    dtype = _NUMPY_DTYPES.get(a.dtype) or _NAMES_NUMPY_LACKS.get(a.dtype.name)
    if dtype is None:
        raise _unsupported(what, a.dtype)
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous (use numpy.ascontiguousarray)")
    return Buffer(a.ctypes.data, a.size, dtype, "cpu", -1, not a.flags.writeable, a)


def _from_cuda_array_interface(a, what):
    info = a.__cuda_array_interface__
    dtype = _TYPESTR_DTYPES.get(info["typestr"])
    if dtype is None:
        raise _unsupported(what, info["typestr"])
    shape = tuple(info["shape"])
    numel = int(np.prod(shape)) if shape else 1
    strides = info.get("strides")
    if strides is not None:
        item = _ITEMSIZES[dtype]
        expected, contiguous = item, True
        for size, stride in zip(reversed(shape), reversed(strides)):
            if size > 1 and stride != expected:
                contiguous = False
            expected *= size
        if not contiguous:
            raise ValueError(f"{what} must be C-contiguous")
    address, readonly = info["data"]
    device = getattr(getattr(a, "device", None), "id", 0)
    return Buffer(address, numel, dtype, "cuda", int(device), bool(readonly), a)


def as_c_dtype(dtype):
    """_C.DataType from a torch dtype, numpy dtype or name ("bfloat16")."""
    if isinstance(dtype, torch.dtype):
        name = _TORCH_DTYPES.get(dtype)
    elif isinstance(dtype, str):
        name = dtype
    else:
        name = np.dtype(dtype).name
    if name not in _C_DTYPES:
        raise _unsupported("wire_dtype", dtype)
    return _C_DTYPES[name]


def as_buffer(array, what="tensor"):
    """Buffer for a torch tensor, numpy array or CUDA-array-interface object; raises on bad input."""
    if isinstance(array, torch.Tensor):
        return _from_torch(array, what)
    if isinstance(array, np.ndarray):
        return _from_numpy(array, what)
    if hasattr(array, "__cuda_array_interface__"):
        return _from_cuda_array_interface(array, what)
    raise TypeError(f"{what} must be a torch.Tensor, numpy.ndarray or CUDA array (cupy), "
                    f"not {type(array).__name__}")
