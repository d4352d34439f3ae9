"""The shared benchmark harness (nccl-tests' common.cu in miniature): sizes, warm-up, timing,
checking, the table, JSON and the plot. Collective-specific parts live in collectives.py.

Timing follows nccl-tests: per size, synchronise every rank, warm up (the implementation's own
calls then leave the ranks aligned, closer than the control group's barrier does), run `iters`
calls back to back, and take the per-rank mean; a round's time is the slowest rank's. On a noisy
machine run several rounds: the implementations alternate within each round (on the same
buffers, each following every other in turn), and a record holds every round's time, their
median (the reported time) and their spread. Validation runs after timing, on freshly
initialised buffers, so checking never slows the timed loop.
"""
import contextlib
import json
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from collectives import Pattern, all_gather_tensor

# nccl-tests' type names first; torch-style aliases accepted on the command line.
DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
          "half": torch.float16, "float": torch.float32, "double": torch.float64,
          "bfloat16": torch.bfloat16}
DTYPE_ALIASES = {"float16": "half", "float32": "float", "float64": "double", "bf16": "bfloat16",
                 "int": "int32", "char": "int8"}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'8', '1K', '64M', '1G' (powers of 1024, like nccl-tests) -> bytes."""
    text = str(text).strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        value = int(text[: len(text) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"bad size {text!r}: use a number with an optional K, M or G") from None
    if value <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return value


def format_size(nbytes):
    for unit in ("G", "M", "K"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def sweep(minbytes, maxbytes, factor):
    """minbytes, minbytes*factor, ... <= maxbytes, and maxbytes itself (so -e is always measured)."""
    if factor < 2:
        raise ValueError("stepfactor must be >= 2")
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    if not sizes or sizes[-1] != maxbytes:
        sizes.append(maxbytes)
    return sizes


# -- timing ----------------------------------------------------------------------------------

class CpuTimer:
    """Wall clock; CPU collectives return when this rank's part is done. mark() after each call
    notes the time (into a list allocated by start, not in the timed loop)."""

    def start(self, calls=0):
        self.marks = [0.0] * calls
        self.done = 0
        self.t0 = time.perf_counter()

    def mark(self):
        self.marks[self.done] = time.perf_counter()
        self.done += 1

    def stop(self):
        return time.perf_counter() - self.t0

    def laps(self):
        """Seconds of each marked call."""
        edges = [self.t0] + self.marks[:self.done]
        return [b - a for a, b in zip(edges, edges[1:])]

    def sync(self):
        pass


class CudaTimer:
    """CUDA events on the current stream: measures the GPU work, not Python's launch time. The
    events of mark() are made by start(), before the timed loop."""

    def __init__(self):
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.marks = []

    def start(self, calls=0):
        while len(self.marks) < calls:
            self.marks.append(torch.cuda.Event(enable_timing=True))
        self.done = 0
        self.begin.record()

    def mark(self):
        self.marks[self.done].record()
        self.done += 1

    def stop(self):
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3

    def laps(self):
        edges = [self.begin] + self.marks[:self.done]
        return [a.elapsed_time(b) / 1e3 for a, b in zip(edges, edges[1:])]

    def sync(self):
        torch.cuda.synchronize()


def memcpy_bandwidth(device, nbytes=64 << 20, reps=5):
    """The local copy bandwidth (bytes copied per second, GB = 1e9): the ceiling for any collective
    that moves data through this memory."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = CudaTimer() if src.is_cuda else CpuTimer()
    dst.copy_(src)  # first touch: page faults are not bandwidth
    times = []
    for _ in range(reps):
        timer.sync()
        timer.start()
        dst.copy_(src)
        times.append(timer.stop())
    return nbytes / sorted(times)[len(times) // 2] / 1e9


# -- measuring -------------------------------------------------------------------------------

@dataclass
class Impl:
    """One implementation under test: name (ringcomm, gloo, nccl, nccl-ring) and its run call."""

    name: str
    run: object  # (coll, bufs) -> None


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

    def __init__(self, rank, nranks, device, ctl_group, settings):
        self.rank, self.n, self.device, self.ctl, self.s = rank, nranks, device, ctl_group, settings
        self.dtype = DTYPES[settings.type_name]
        self.timer = CudaTimer() if device.type == "cuda" else CpuTimer()

    def _time(self, impl, coll, bufs):
        self.timer.sync()
        dist.barrier(group=self.ctl)  # every rank starts together...
        for _ in range(self.s.warmup):  # ...and the last warm-up call aligns them closer still
            impl.run(coll, bufs)
        self.timer.start(self.s.iters)
        for _ in range(self.s.iters):
            impl.run(coll, bufs)
            self.timer.mark()
        return self.timer.stop() / self.s.iters, self.timer.laps()

    def _wrong(self, impl, coll, bufs, pattern, p):
        """#wrong elements on this rank, after one call on fresh inputs (nccl-tests' check)."""
        coll.init(bufs, pattern, self.n)
        impl.run(coll, bufs)
        expected = coll.expected(pattern, self.rank, self.n, p, self.s.root)
        if expected is None:  # output unspecified on this rank (reduce/gather off the root)
            return 0
        out = bufs.recv
        if self.s.op == "avg" and out.is_floating_point():  # one rounding: allow 2 ulp
            tol = 2 * torch.finfo(out.dtype).eps * expected.abs()
            return int(((out.double() - expected).abs() > tol).sum())
        return int((out != expected.to(out.dtype)).sum())

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
                rounds = {impl.name: [] for impl in impls}
                calls = {impl.name: [] for impl in impls}
                for r in range(self.s.rounds):
                    # Implementations alternate on the same buffers, each following every other
                    # in turn, so none keeps inheriting one neighbour's traces.
                    for impl in (impls[i] for i in balanced_order(len(impls), r)):
                        mean, laps = self._time(impl, coll, bufs)
                        rounds[impl.name].append(max(self._every_rank(mean)))
                        calls[impl.name] += self._slowest_per_call(laps)
                        bar.update()
                for impl in impls:
                    wrong = None
                    if self.s.check:
                        mine = self._wrong(impl, coll, bufs, pattern, p)
                        wrong = int(sum(self._every_rank(mine)))
                    row.append(self._record(coll, impl.name, p, full * elsize, inplace,
                                            rounds[impl.name], calls[impl.name], wrong))
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

    def _record(self, coll, impl, count, nbytes, inplace, rounds, calls, wrong):
        seconds = statistics.median(rounds)
        algbw = nbytes / seconds / 1e9
        return {"collective": coll.name, "impl": impl, "size": nbytes, "count": count,
                "type": self.s.type_name, "redop": self.s.op if coll.has_op else "none",
                "root": self.s.root if coll.has_root else -1, "inplace": inplace,
                "time_us": seconds * 1e6, "algbw": algbw, "busbw": algbw * coll.bus_factor(self.n),
                "wrong": wrong, "nranks": self.n, "device": self.device.type,
                "rounds_us": [t * 1e6 for t in rounds], "spread_us": spread(rounds) * 1e6,
                # Per call (slowest rank each): a mean hides a split between fast calls and
                # scheduler-slice-long ones; the median and the 99th percentile do not.
                "p50_us": percentile(calls, 50) * 1e6, "p99_us": percentile(calls, 99) * 1e6,
                "calls": len(calls)}


def percentile(values, q):
    """The q-th percentile (linear between the nearest ranks, as numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def balanced_order(k, r):
    """Round r's order of k implementations, a Williams design: over k rounds (2k for odd k)
    each implementation runs right after every other one equally often."""
    base, low, high = [0], 1, k - 1
    for j in range(1, k):  # 0, 1, k-1, 2, k-2, ...
        base.append(low if j % 2 else high)
        low, high = (low + 1, high) if j % 2 else (low, high - 1)
    order = [(b + r) % k for b in base]
    return order[::-1] if k % 2 and (r // k) % 2 else order


def spread(values):
    """The interquartile range: how far the middle half of the rounds lies apart (0 for one)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q3 - q1


# -- the machine's own load ------------------------------------------------------------------

def _spin():
    while True:
        pass


@contextlib.contextmanager
def busy_load(processes):
    """`processes` busy-looping processes for the duration: a busy machine on demand."""
    ctx = multiprocessing.get_context("fork")
    spinners = [ctx.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
        for p in spinners:
            p.join()


def cpu_times():
    """The machine's CPU time so far, from /proc/stat: {busy, steal, total} in clock ticks (empty
    where /proc/stat is missing). Two readings give the share of the machine that was busy and
    that the hypervisor took (steal) in between."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return {}
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return {"busy": user + nice + system + irq + softirq, "steal": steal, "total": total}


def machine_load(before, after):
    """{busy_pct, steal_pct} of the machine's cores between two cpu_times() readings."""
    ticks = after.get("total", 0) - before.get("total", 0)
    if ticks <= 0:
        return {}
    return {k + "_pct": 100 * (after[k] - before[k]) / ticks for k in ("busy", "steal")}


# -- output ----------------------------------------------------------------------------------

_KEY = "{:>12} {:>13} {:>9} {:>6} {:>5}"
_BLOCK = " {:>9} {:>7} {:>7} {:>6}"
_TAIL = " {:>9} {:>9}"


def table_header(impl_names, title_lines):
    """nccl-tests' header: key columns, then (out-of-place, in-place) per implementation, then
    the ratio of the first implementation's busbw to the last's, then each implementation's
    per-call median and 99th percentile (in place where measured, else out of place)."""
    lines = [f"# {line}" for line in title_lines] + ["#"]
    width = len(_BLOCK.format("", "", "", ""))
    blocks = "".join(f"{name + ': out-of-place':>{width}}{'in-place':>{width}}" for name in impl_names)
    ratio = f"  {impl_names[0]}/{impl_names[-1]} busbw" if len(impl_names) > 1 else ""
    tail_width = len(_TAIL.format("", ""))
    tails = "".join(f"{name + ': per call':>{tail_width}}" for name in impl_names)
    lines.append("#" + " " * 49 + blocks + ratio + tails)
    cols = _BLOCK.format("time", "algbw", "busbw", "#wrong") * 2 * len(impl_names)
    units = _BLOCK.format("(us)", "(GB/s)", "(GB/s)", "") * 2 * len(impl_names)
    ratio_cols = "   oop     ip" if ratio else ""
    lines.append("#" + _KEY.format("size", "count", "type", "redop", "root")[1:] + cols
                 + ratio_cols + _TAIL.format("p50", "p99") * len(impl_names))
    lines.append("#" + _KEY.format("(B)", "(elements)", "", "", "")[1:] + units
                 + " " * len(ratio_cols) + _TAIL.format("(us)", "(us)") * len(impl_names))
    return "\n".join(lines)


def table_row(records, impl_names):
    """One line from one size's records (any order); N/A where a variant was not measured."""
    by = {(r["impl"], r["inplace"]): r for r in records}
    first = records[0]
    line = _KEY.format(first["size"], first["count"], first["type"], first["redop"], first["root"])
    for name in impl_names:
        for inplace in (False, True):
            r = by.get((name, inplace))
            if r is None:
                line += _BLOCK.format("N/A", "N/A", "N/A", "N/A")
            else:
                wrong = "N/A" if r["wrong"] is None else r["wrong"]
                line += _BLOCK.format(_time_text(r["time_us"]), f"{r['algbw']:.2f}",
                                      f"{r['busbw']:.2f}", wrong)
    if len(impl_names) > 1:
        for inplace in (False, True):
            a, b = by.get((impl_names[0], inplace)), by.get((impl_names[-1], inplace))
            # Same size and factor, so the busbw ratio is the time ratio (defined even when n = 1).
            line += f" {b['time_us'] / a['time_us']:6.2f}" if a and b else f" {'N/A':>6}"
    for name in impl_names:
        r = by.get((name, True)) or by.get((name, False))
        line += _TAIL.format(_time_text(r["p50_us"]), _time_text(r["p99_us"])) if r and \
            "p50_us" in r else _TAIL.format("N/A", "N/A")
    return line


def _time_text(us):
    """Fixed width like nccl-tests: fewer decimals as the time grows."""
    return f"{us:.2f}" if us < 1e4 else f"{us:.1f}" if us < 1e5 else f"{us:.0f}"


def write_json(path, records):
    with open(path, "w") as f:
        json.dump(records, f, indent=1)


def write_plot(path, records, title):
    """One panel per collective: busbw against size, log-x, one line per implementation and
    variant; below it, each implementation's per-call median (solid) and 99th percentile
    (dotted) time."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(r["collective"] for r in records))
    fig, axes = plt.subplots(2, len(colls), figsize=(6 * len(colls), 8), squeeze=False)
    for ax, tails, coll in zip(axes[0], axes[1], colls):
        mine = [r for r in records if r["collective"] == coll]
        for color, impl in enumerate(dict.fromkeys(r["impl"] for r in mine)):
            for inplace in (False, True):
                pts = sorted((r["size"], r["busbw"], r.get("p50_us"), r.get("p99_us"))
                             for r in mine if r["impl"] == impl and r["inplace"] == inplace)
                if not pts:
                    continue
                variant = "in-place" if inplace else "out-of-place"
                sizes = [p[0] for p in pts]
                ax.plot(sizes, [p[1] for p in pts], marker="o", ms=3, color=f"C{color}",
                        linestyle="-" if inplace else "--", label=f"{impl} ({variant})")
                if pts[0][2] is not None and (inplace or not any(
                        r["inplace"] for r in mine if r["impl"] == impl)):
                    tails.plot(sizes, [p[2] for p in pts], marker="o", ms=3, color=f"C{color}",
                               label=f"{impl} p50")
                    tails.plot(sizes, [p[3] for p in pts], marker=".", color=f"C{color}",
                               linestyle=":", label=f"{impl} p99")
        ax.set(title=coll, xlabel="size (bytes)", ylabel="busbw (GB/s)")
        size_axis(ax)
        tails.set(yscale="log", xlabel="size (bytes)", ylabel="time per call (us)")
        size_axis(tails)
    save_figure(fig, path, title)


def size_axis(ax):
    """A log2 size axis labelled 8, 1K, 64M, a grid and the legend."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=10))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def save_figure(fig, path, title):
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
