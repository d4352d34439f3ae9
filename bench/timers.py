"""Timing one implementation's calls: wall clock on CPU, CUDA events on GPU; the local copy
bandwidth (the ceiling a collective's bandwidth is read against) and, on CPU, the round trip
between two ranks' cores."""
import os
import time

import torch


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


class CopyCeiling:
    """The local copy bandwidth (bytes copied per second, GB = 1e9): the ceiling for any collective
    that moves data through this memory. One process copies `nbytes` with torch's threads (as
    many as it had at start: the cores), alone on the machine while other ranks wait. A sample
    taken between a benchmark's rounds follows the machine's state, which drifts; the median of
    the samples is the figure."""

    def __init__(self, device, nbytes=64 << 20):
        self.threads = torch.get_num_threads()
        self.src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.timer = CudaTimer() if self.src.is_cuda else CpuTimer()
        self.dst.copy_(self.src)  # first touch: page faults are not bandwidth
        self.samples = []

    def sample(self, reps=1):
        """Times `reps` copies, keeping each one's bandwidth; returns the latest."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            self.dst[:1 << 20].copy_(self.src[:1 << 20])  # wakes (or starts) the thread pool
            for _ in range(reps):
                self.timer.sync()
                self.timer.start()
                self.dst.copy_(self.src)
                self.samples.append(self.src.numel() / self.timer.stop() / 1e9)
        finally:
            torch.set_num_threads(threads)
        return self.samples[-1]

    def median(self):
        return sorted(self.samples)[len(self.samples) // 2]


class CoreRoundTrip:
    """A cache line's round trip between the CPUs of the first two local ranks (their first CPU
    each where ranks get a share of the cores, as pinning gives them): every byte local ranks
    exchange crosses between their cores, and on a virtual machine this moves by 5x when the
    hypervisor moves the virtual CPUs. `cpus` is None where it cannot be measured (fewer than
    two CPUs, or ringcomm built without its testing module)."""

    def __init__(self, world):
        from ringcomm.world import pinning
        try:
            from ringcomm import _testing
        except ImportError:
            _testing = None
        allowed = sorted(os.sched_getaffinity(0))
        self.measure = getattr(_testing, "core_round_trip_ns", None)
        self.cpus = None
        if self.measure and len(allowed) >= 2:
            shares = min(world, len(allowed))
            self.cpus = tuple(min(pinning.group(allowed, i, shares)) for i in (0, 1))
        self.samples = []

    def sample(self):
        if self.cpus:
            self.samples.append(self.measure(*self.cpus))

    def describe(self):
        """'median N ns (a-b)' over the samples so far, or why there are none."""
        if not self.samples:
            return "not measured (one CPU, or no ringcomm._testing)"
        s = sorted(self.samples)
        return (f"CPUs {self.cpus[0]} and {self.cpus[1]}: median {s[len(s) // 2]:.0f} ns "
                f"({s[0]:.0f}-{s[-1]:.0f}) of {len(s)} samples")
