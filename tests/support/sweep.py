"""Exact inputs and references for the collective sweep (nccl-tests style #wrong counts).

Inputs are small integers chosen per op so that every result is exactly representable in every
dtype, whatever the order of reduction: then float results must match bit for bit."""
import torch

from ringcomm import _C

# From the C++ tables (csrc/include/ringcomm/types.h): a new op or dtype is swept once the
# references below know it.
DTYPES = [getattr(torch, name) for name in _C.DataType.__members__]
OPS = list(_C.RedOp.__members__)
FLOATS = {dtype for dtype in DTYPES if dtype.is_floating_point}


def op_valid(op, dtype):
    return _C.op_supported(_C.RedOp.__members__[op], _C.DataType.__members__[str(dtype)[6:]])


def rank_values(rank, world_size, count, op, dtype, salt=0):
    """Rank `rank`'s input as int64 (before casting to dtype)."""
    i = torch.arange(count, dtype=torch.int64) + salt
    if dtype == torch.bool:
        return (i * 3 + rank) % 2
    if op == "prod":
        return torch.tensor([1, -1, 1, 2])[(i + rank * 3) % 4] if dtype != torch.uint8 else \
            torch.tensor([1, 3, 1, 2])[(i + rank * 3) % 4]
    if op in ("band", "bor", "bxor"):
        return (i * 37 + rank * 11) % 128
    if op in ("land", "lor"):
        return (i + rank) % 3
    base = (i * 7 + rank * 13) % 11 - 5
    if dtype == torch.uint8:
        base = base + 5
    if op == "avg":  # the mean of multiples of N is exact; small enough not to wrap in int8
        base = (base % 2 if dtype in (torch.int8, torch.uint8) else base) * world_size
    return base


def make_input(rank, world_size, count, op, dtype, salt=0):
    return rank_values(rank, world_size, count, op, dtype, salt).to(dtype)


def reduce_reference(world_size, count, op, dtype, salt=0):
    """op over all ranks' inputs, computed exactly in int64/float64, then cast to dtype."""
    inputs = [rank_values(r, world_size, count, op, dtype, salt) for r in range(world_size)]
    if dtype == torch.bool:
        bits = [x.bool() for x in inputs]
        if op in ("sum", "max", "bor", "lor"):
            return torch.stack(bits).any(0)
        if op in ("prod", "min", "band", "land"):
            return torch.stack(bits).all(0)
        out = bits[0]
        for x in bits[1:]:
            out = out ^ x
        return out
    stacked = torch.stack(inputs)
    if op == "sum":
        result = stacked.sum(0)
    elif op == "avg":
        result = stacked.sum(0) // world_size
    elif op == "prod":
        result = stacked.prod(0)
    elif op == "min":
        result = stacked.min(0).values
    elif op == "max":
        result = stacked.max(0).values
    elif op == "land":
        result = (stacked != 0).all(0).long()
    elif op == "lor":
        result = (stacked != 0).any(0).long()
    else:
        result = inputs[0]
        for x in inputs[1:]:
            result = {"band": result & x, "bor": result | x, "bxor": result ^ x}[op]
    if dtype in FLOATS:
        return result.to(torch.float64).to(dtype)
    return result.to(dtype)  # int64 -> narrower ints wraps, as the ring's arithmetic does


def wrong(actual, expected):
    """Number of elements that differ (bitwise for floats: exact inputs have exact results)."""
    if actual.numel() != expected.numel():
        return max(actual.numel(), expected.numel())
    return int((actual.reshape(-1) != expected.reshape(-1)).sum())
