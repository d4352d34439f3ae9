// How long a cache line takes to go from one CPU to another and back: two threads, each bound to
// its CPU, hand a counter back and forth. Every byte a collective exchanges between local ranks
// crosses between their cores, so this is the machine's price for it; on a virtual machine it
// changes when the hypervisor moves the virtual CPUs (docs/benchmarks.md).
#pragma once

namespace ringcomm {

// Nanoseconds per round trip between cpuA and cpuB, the median of `samples` runs of `rounds`
// round trips each. Raises Error when a thread cannot be bound to its CPU.
double coreRoundTripNanos(int cpuA, int cpuB, int rounds, int samples);

}  // namespace ringcomm
