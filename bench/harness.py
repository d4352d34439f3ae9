"""The measuring loop (nccl-tests' common.cu in miniature): per size, warm-up, timed calls and
the check, on every rank; rank 0 gets the records. Collective-specific parts live in
collectives.py, the timers in timers.py, a record's layout and statistics in records.py.

Timing follows nccl-tests: per size, synchronise every rank, warm up (the implementation's own
calls then leave the ranks aligned, closer than the control group's barrier does), run `iters`
calls back to back, and take the per-rank mean; a round's time is the slowest rank's. On a noisy
machine run several rounds: the implementations alternate within each round (on the same
buffers, each following every other in turn), and a record holds every round's time, their
median (the reported time) and their spread. Validation runs after timing, on freshly
initialised buffers, so checking never slows the timed loop.
"""
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from collectives import DTYPES, Pattern, all_gather_tensor
from records import record
from timers import CpuTimer, CudaTimer


@dataclass
class Impl:
    """One implementation under test: name (ringcomm, gloo, nccl, nccl-ring) and its run call."""

    name: str
    run: object  # (coll, bufs) -> None
    sent: object = None  # () -> bytes this rank has sent or published so far, where it counts
    checked: bool = True  # its results are a collective's (a copy's are not)
    in_place: bool = True  # has nccl-tests' in-place form (False: its in-place rows are N/A)


@dataclass
class Settings:
    iters: int = 20
    warmup: int = 5
    check: bool = True
    op: str = "sum"
    root: int = 0
    type_name: str = "float"
    rounds: int = 1  # interleaved repetitions per size: median and spread over them


_BAR_DELAY = 2  # seconds before the progress bar appears


class Bench:
    """Runs one collective over a size sweep on every rank; rank 0 gets the records."""

    def __init__(self, rank, nranks, device, ctl_group, settings, between_rounds=None):
        """`between_rounds()`, if given, runs on every rank after each round of every size (the
        machine's samples: bench/run.py's copy ceiling and core round trip)."""
        self.rank, self.n, self.device, self.ctl, self.s = rank, nranks, device, ctl_group, settings
        self.between_rounds = between_rounds
        self.dtype = DTYPES[settings.type_name]
        self.timer = CudaTimer() if device.type == "cuda" else CpuTimer()

    def _time(self, impl, coll, bufs):
        """(mean seconds per call, each call's seconds, bytes sent per call or None)."""
        self.timer.sync()
        dist.barrier(group=self.ctl)  # every rank starts together...
        for _ in range(self.s.warmup):  # ...and the last warm-up call aligns them closer still
            impl.run(coll, bufs)
        before = impl.sent() if impl.sent else None  # read outside the timed calls
        self.timer.start(self.s.iters)
        for _ in range(self.s.iters):
            impl.run(coll, bufs)
            self.timer.mark()
        mean = self.timer.stop() / self.s.iters
        sent = (impl.sent() - before) / self.s.iters if impl.sent else None
        return mean, self.timer.laps(), sent

    def _wrong(self, impl, coll, bufs, pattern, p):
        """#wrong elements on this rank, after one call on fresh inputs (nccl-tests' check)."""
        coll.init(bufs, pattern, self.n)
        impl.run(coll, bufs)
        return coll.wrong(bufs, pattern, self.n, p, self.s.root, self.s.op)

    def _every_rank(self, value):
        """`value` from every rank, in rank order (on the control group)."""
        every = torch.empty(self.n, dtype=torch.float64)
        all_gather_tensor(every, torch.tensor([float(value)], dtype=torch.float64), group=self.ctl)
        return every.tolist()

    def _slowest_per_call(self, laps):
        """Each call's time on its slowest rank (on the control group)."""
        mine = torch.tensor(laps, dtype=torch.float64)
        every = torch.empty(self.n * mine.numel(), dtype=torch.float64)
        all_gather_tensor(every, mine, group=self.ctl)
        return every.view(self.n, -1).max(0).values.tolist()

    def run(self, coll, impls, sizes, on_row=None):
        """Measures every size, variant and implementation; returns rank 0's records."""
        elsize = torch.tensor([], dtype=self.dtype).element_size()
        pattern = Pattern(self.s.op, self.dtype, self.n, self.device)
        variants = [True] if coll.in_place_only else [False, True]
        counts = sorted({coll.counts(b, elsize, self.n) for b in sizes})
        records = []
        # A bar only where someone watches (a terminal), and only once a sweep takes a while.
        bar = tqdm(total=len(counts) * len(variants) * len(impls) * self.s.rounds, desc=coll.name,
                   unit="run", file=sys.stderr, delay=_BAR_DELAY, leave=False,
                   disable=self.rank != 0 or not sys.stderr.isatty())
        for p, full in counts:
            row = []
            for inplace in variants:
                bufs = coll.allocate(p, self.n, self.rank, self.dtype, self.device, inplace)
                coll.init(bufs, pattern, self.n)
                impls_here = [i for i in impls if i.in_place or not inplace]
                rounds = {impl.name: [] for impl in impls}
                calls = {impl.name: [] for impl in impls}
                sent = {impl.name: [] for impl in impls}  # the most any rank sent per call
                for r in range(self.s.rounds):
                    # Implementations alternate on the same buffers, each following every other
                    # in turn, so none keeps inheriting one neighbour's traces.
                    for impl in (impls_here[i] for i in balanced_order(len(impls_here), r)):
                        mean, laps, mine = self._time(impl, coll, bufs)
                        rounds[impl.name].append(max(self._every_rank(mean)))
                        if mine is not None:
                            sent[impl.name].append(max(self._every_rank(mine)))
                        calls[impl.name] += self._slowest_per_call(laps)
                        bar.update()
                    if self.between_rounds:
                        self.between_rounds()
                for impl in impls_here:
                    wrong = None
                    if self.s.check and impl.checked:
                        mine = self._wrong(impl, coll, bufs, pattern, p)
                        wrong = int(sum(self._every_rank(mine)))
                    row.append(record(coll, self.s, self.n, self.device, impl.name, p,
                                      full * elsize, inplace, rounds[impl.name],
                                      calls[impl.name], wrong, sent[impl.name]))
                del bufs
            records += row
            if on_row and self.rank == 0:
                shown = not bar.disable and time.time() - bar.start_t >= _BAR_DELAY
                if shown:  # refresh() would show the bar before its delay is up
                    bar.clear()
                on_row(row)
                if shown:
                    bar.refresh()
        bar.close()
        return records


def balanced_order(k, r):
    """Round r's order of k implementations, a Williams design: over k rounds (2k for odd k)
    each implementation runs right after every other one equally often."""
    base, low, high = [0], 1, k - 1
    for j in range(1, k):  # 0, 1, k-1, 2, k-2, ...
        base.append(low if j % 2 else high)
        low, high = (low + 1, high) if j % 2 else (low, high - 1)
    order = [(b + r) % k for b in base]
    return order[::-1] if k % 2 and (r // k) % 2 else order
