"""Every collective, checked against exact references (tests/support/sweep.py) on CPU or CUDA tensors:
the sweep behind tests/test_collectives.py (CPU, several world sizes) and the GPU check's
world-2 sweep (tests/test_gpu.py), nccl-tests style #wrong counts per case."""
import numpy as np
import torch

from sweep import DTYPES, OPS, make_input, op_valid, reduce_reference, wrong

VALID = [(dtype, op) for dtype in DTYPES for op in OPS if op_valid(op, dtype)]


def one_dtype_per_op():
    """Every op once, the dtypes taking turns, so that every dtype shows up too."""
    cases = []
    for i, op in enumerate(OPS):
        valid = [dtype for dtype in DTYPES if op_valid(op, dtype)]
        cases.append((valid[i % len(valid)], op))
    return cases


def counts_for(n):
    """Awkward counts: 0, 1, fewer elements than ranks, one more than ranks, a prime, 1000."""
    return sorted({0, 1, max(n - 1, 0), n + 1, 7, 1000})


class Checker:
    """Runs every collective once per call on `device` tensors and records each case's #wrong
    elements against the exact reference (computed on the CPU)."""

    def __init__(self, comm, device="cpu"):
        self.comm, self.rank, self.n = comm, comm.rank, comm.world_size
        self.device = torch.device(device)
        self.failures, self.cases = [], 0

    def input(self, rank, count, op, dtype, salt=0):
        return make_input(rank, self.n, count, op, dtype, salt).to(self.device)

    def empty(self, count, dtype):
        return torch.zeros(count, dtype=dtype, device=self.device)

    def check(self, name, actual, expected):
        self.cases += 1
        if actual.is_cuda:
            torch.cuda.synchronize()  # the collective is ordered on the stream, not done yet
        bad = wrong(actual.cpu(), expected.cpu())
        if bad:
            self.failures.append(f"rank {self.rank} {name}: #wrong {bad} of {expected.numel()}")

    def reductions(self, count, dtype, op):
        comm, r, n = self.comm, self.rank, self.n
        tag = f"{dtype} {op} count {count}"
        t = self.input(r, count, op, dtype)
        comm.all_reduce(t, op=op)
        self.check(f"all_reduce {tag}", t, reduce_reference(n, count, op, dtype))
        self.reduce_scatters(count, dtype, op)
        root = count % n
        t = self.input(r, count, op, dtype)
        comm.reduce(t, dst=root, op=op)
        want = reduce_reference(n, count, op, dtype) if r == root else make_input(r, n, count, op, dtype)
        self.check(f"reduce dst={root} {tag}", t, want)

    def reduce_scatters(self, count, dtype, op, algorithm=None):
        """reduce_scatter out of place (the input untouched) and in place, by `algorithm`."""
        comm, r, n = self.comm, self.rank, self.n
        tag = f"{algorithm or ''} {dtype} {op} count {count}"
        # Element j of rank r's block is element r * count + j of the whole input.
        full = reduce_reference(n, count, op, dtype, salt=r * count)
        inp = self.input(r, n * count, op, dtype)
        before = inp.clone()
        out = self.empty(count, dtype)
        comm.reduce_scatter(out, inp, op=op, algorithm=algorithm)
        self.check(f"reduce_scatter {tag}", out, full)
        self.check(f"reduce_scatter input untouched {tag}", inp, before)
        comm.reduce_scatter(inp[r * count:(r + 1) * count], inp, op=op, algorithm=algorithm)
        self.check(f"reduce_scatter in-place {tag}", inp[r * count:(r + 1) * count], full)

    def all_gathers(self, count, dtype, algorithm=None):
        """all_gather out of place and in place, by `algorithm`; returns (every block, this
        rank's)."""
        comm, r, n = self.comm, self.rank, self.n
        tag = f"{algorithm or ''} {dtype} count {count}"
        everyone = torch.cat([self.input(q, count, "sum", dtype, salt=q) for q in range(n)])
        mine = self.input(r, count, "sum", dtype, salt=r)
        out = self.empty(n * count, dtype)
        comm.all_gather(out, mine, algorithm=algorithm)
        self.check(f"all_gather {tag}", out, everyone)
        out = self.empty(n * count, dtype)
        out[r * count:(r + 1) * count] = mine
        comm.all_gather(out, out[r * count:(r + 1) * count], algorithm=algorithm)  # in place
        self.check(f"all_gather in-place {tag}", out, everyone)
        return everyone, mine

    def scatter_gather_sweep(self, counts, cases, algorithm):
        """reduce_scatter and all_gather by `algorithm` at each of `counts`: for `cases`
        ((dtype, op) pairs; float32 avg and int64 max from 10,000 elements) and two dtypes."""
        for count in counts:
            big = [(torch.float32, "avg"), (torch.int64, "max")]
            for dtype, op in cases if count < 10_000 else big:
                self.reduce_scatters(count, dtype, op, algorithm)
            for dtype in (torch.int32, torch.float64):
                self.all_gathers(count, dtype, algorithm)

    def copies(self, count, dtype):
        comm, r, n = self.comm, self.rank, self.n
        tag = f"{dtype} count {count}"
        everyone, mine = self.all_gathers(count, dtype)
        for root in sorted({0, (count + 1) % n}):
            t = self.input(r, count, "sum", dtype, salt=r)
            comm.broadcast(t, src=root)
            self.check(f"broadcast src={root} {tag}", t, self.input(root, count, "sum", dtype, salt=root))

            out = self.empty(n * count, dtype) if r == root else None
            comm.gather(out, mine, dst=root)
            if r == root:
                self.check(f"gather dst={root} {tag}", out, everyone)

            out = self.empty(count, dtype)
            comm.scatter(out, everyone.clone() if r == root else None, src=root)
            self.check(f"scatter src={root} {tag}", out, everyone[r * count:(r + 1) * count])

    def numpy_arrays(self):
        comm, r, n = self.comm, self.rank, self.n
        a = np.arange(10, dtype=np.int32) + r
        comm.all_reduce(a, op="max")
        self.check("numpy all_reduce", torch.from_numpy(a), torch.arange(10, dtype=torch.int32) + n - 1)
        out = np.zeros(3 * n, dtype=np.float64)
        comm.all_gather(out, np.full(3, float(r)))
        self.check("numpy all_gather", torch.from_numpy(out), torch.arange(n, dtype=torch.float64).repeat_interleave(3))
