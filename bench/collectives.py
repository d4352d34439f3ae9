"""The collectives the benchmark knows, each in the shape of nccl-tests' ``struct testColl``:
buffer layout (what the byte count means), input data with an exact expected result, the
bus-bandwidth factor, and one run call for ringcomm and one for torch.distributed (the baseline).

Inputs are small integers, so every sum, product, min and max is exact in every dtype and in
any reduction order: a result is right or wrong, never "close".
"""
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ringcomm import _C
from ringcomm.ops import torch_reduce_ops


def _exact_limit(dtype):
    """The largest integer `dtype` holds exactly (all below it too): 2 / eps for a float."""
    if dtype.is_floating_point:
        return round(2 / torch.finfo(dtype).eps)
    return torch.iinfo(dtype).max


# Every dtype ringcomm has but bool (values of 1..k are not bools).
_DTYPE_NAMES = [name for name in _C.DataType.__members__ if name != "bool"]
# Each with its largest exact integer: that bounds the values so a reduction over n ranks is exact.
EXACT_LIMIT = {getattr(torch, name): _exact_limit(getattr(torch, name)) for name in _DTYPE_NAMES}

# The -d names: nccl-tests' type names (half, float and double where torch says float16, float32
# and float64); torch's names and a few short ones are accepted as aliases.
_NCCL_TEST_NAMES = {"float16": "half", "float32": "float", "float64": "double"}
DTYPES = {_NCCL_TEST_NAMES.get(name, name): getattr(torch, name) for name in _DTYPE_NAMES}
DTYPE_ALIASES = {**_NCCL_TEST_NAMES, "bf16": "bfloat16", "int": "int32", "char": "int8"}

# torch 2.13 renamed the tensor forms (the old names warn); torch >= 2.4 has only the old ones.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# How Pattern reduces each op it has a reference for, in int64 (avg divides the sum at the end).
REFERENCES = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum,
              "max": torch.maximum}
# The ops the benchmark runs: ringcomm's that torch.distributed has and REFERENCES can check.
TORCH_OPS = {name: op for name, op in torch_reduce_ops().items() if name in REFERENCES}


class Pattern:
    """Rank s's input element i, and the reduction of those values over ranks, in int64/float64."""

    def __init__(self, op, dtype, nranks, device):
        self.op, self.n, self.device = op, nranks, device
        # Values 1..k with n*k within the dtype's exact range (k >= 1 even for many ranks).
        self.k = max(1, min(8, EXACT_LIMIT[dtype] // nranks))

    def values(self, rank, start, length):
        i = torch.arange(start, start + length, dtype=torch.int64, device=self.device)
        if self.op == "prod":
            # Exactly one rank contributes a 2 at each index: the product is 2 for any n.
            return torch.where((i + rank) % self.n == 0, 2, 1)
        return (i + 3 * rank) % self.k + 1

    def reduce(self, start, length):
        combine = REFERENCES[self.op]
        acc = self.values(0, start, length)
        for s in range(1, self.n):
            acc = combine(acc, self.values(s, start, length))
        return acc.double() / self.n if self.op == "avg" else acc


@dataclass
class Buffers:
    """One size's buffers; in-place variants are views, as nccl-tests does (sendbuff inside recvbuff)."""

    send: torch.Tensor
    recv: torch.Tensor
    blocks: list  # the n-block buffer split per rank: torch's gather/scatter take lists
    rank: int


@dataclass(frozen=True)
class Collective:
    name: str
    # "same": one count-element buffer (in place only, as in ringcomm and torch.distributed);
    # "gather": send p, recv n*p elements; "scatter": send n*p, recv p.
    layout: str
    bus_factor: Callable[[int], float]  # busbw = algbw * factor(n), algbw from the full size
    has_op: bool
    has_root: bool
    # (comm, bufs, op_name, root[, algorithm=]): positional, as the baselines call theirs (a
    # **keywords pass-through costs a small call ~0.3 us)
    ringcomm: Callable
    torch: Callable  # (bufs, torch_op, root, group)
    # (pattern, rank, n, p, root) -> expected output of this rank, or None where it is unspecified
    expected: Callable

    @property
    def in_place_only(self):
        return self.layout == "same"

    def counts(self, nbytes, elsize, nranks):
        """(count column, full element count) for a requested byte size: nccl-tests' GetCollByteCount."""
        count = max(1, nbytes // elsize)
        if self.layout == "same":
            return count, count
        p = max(1, count // nranks)  # per-rank block
        return p, p * nranks

    def allocate(self, p, nranks, rank, dtype, device, inplace):
        empty = lambda numel: torch.empty(numel, dtype=dtype, device=device)  # noqa: E731
        if self.layout == "same":
            send = recv = full = empty(p)
        elif self.layout == "gather":
            recv = full = empty(nranks * p)
            send = recv[rank * p:(rank + 1) * p] if inplace else empty(p)
        else:
            send = full = empty(nranks * p)
            recv = send[rank * p:(rank + 1) * p] if inplace else empty(p)
        return Buffers(send, recv, list(full.split(p)) if self.layout != "same" else [], rank)

    def init(self, bufs, pattern, nranks):
        """Writes this rank's input; the output is cleared first so a no-op shows as #wrong."""
        bufs.recv.zero_()
        length = bufs.send.numel()
        bufs.send.copy_(pattern.values(bufs.rank, 0, length))

    def wrong(self, bufs, pattern, n, p, root, op):
        """#wrong elements of this rank's output (nccl-tests' check): exact, but for avg on
        floats, which rounds once and may be 2 ulp off."""
        expected = self.expected(pattern, bufs.rank, n, p, root)
        if expected is None:  # output unspecified on this rank (reduce/gather off the root)
            return 0
        out = bufs.recv
        if op == "avg" and out.is_floating_point():
            tol = 2 * torch.finfo(out.dtype).eps * expected.abs()
            return int(((out.double() - expected).abs() > tol).sum())
        return int((out != expected.to(out.dtype)).sum())


def _reduced(pat, rank, n, p, root):
    return pat.reduce(0, p)


def _gathered(pat, rank, n, p, root):
    return torch.cat([pat.values(s, 0, p) for s in range(n)])


def _at_root(expected):
    return lambda pat, rank, n, p, root: expected(pat, rank, n, p, root) if rank == root else None


def _ring(n):
    return (n - 1) / n


COLLECTIVES = {c.name: c for c in [
    Collective(
        "all_reduce", "same", lambda n: 2 * (n - 1) / n, True, False,
        ringcomm=lambda comm, b, op, root, algorithm=None: comm.all_reduce(
            b.recv, op, algorithm=algorithm),
        torch=lambda b, op, root, g: dist.all_reduce(b.recv, op=op, group=g),
        expected=_reduced),
    Collective(
        "reduce_scatter", "scatter", _ring, True, False,
        ringcomm=lambda comm, b, op, root, algorithm=None: comm.reduce_scatter(
            b.recv, b.send, op, algorithm=algorithm),
        torch=lambda b, op, root, g: reduce_scatter_tensor(b.recv, b.send, op=op, group=g),
        expected=lambda pat, rank, n, p, root: pat.reduce(rank * p, p)),
    Collective(
        "all_gather", "gather", _ring, False, False,
        ringcomm=lambda comm, b, op, root, algorithm=None: comm.all_gather(
            b.recv, b.send, algorithm=algorithm),
        torch=lambda b, op, root, g: all_gather_tensor(b.recv, b.send, group=g),
        expected=_gathered),
    Collective(
        "broadcast", "same", lambda n: 1.0, False, True,
        ringcomm=lambda comm, b, op, root: comm.broadcast(b.recv, root),
        torch=lambda b, op, root, g: dist.broadcast(b.recv, src=root, group=g),
        expected=lambda pat, rank, n, p, root: pat.values(root, 0, p)),
    Collective(
        "reduce", "same", lambda n: 1.0, True, True,
        ringcomm=lambda comm, b, op, root: comm.reduce(b.recv, root, op),
        torch=lambda b, op, root, g: dist.reduce(b.recv, dst=root, op=op, group=g),
        expected=_at_root(_reduced)),
    Collective(
        "gather", "gather", _ring, False, True,
        ringcomm=lambda comm, b, op, root: comm.gather(
            b.recv if b.rank == root else None, b.send, root),
        torch=lambda b, op, root, g: dist.gather(b.send, b.blocks if b.rank == root else None,
                                                 dst=root, group=g),
        expected=_at_root(_gathered)),
    Collective(
        "scatter", "scatter", _ring, False, True,
        ringcomm=lambda comm, b, op, root: comm.scatter(
            b.recv, b.send if b.rank == root else None, root),
        torch=lambda b, op, root, g: dist.scatter(b.recv, b.blocks if b.rank == root else None,
                                                  src=root, group=g),
        expected=lambda pat, rank, n, p, root: pat.values(root, rank * p, p)),
]}
