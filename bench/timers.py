"""Timing one implementation's calls: wall clock on CPU, CUDA events on GPU, and the local copy
bandwidth (the ceiling a collective's bandwidth is read against)."""
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
