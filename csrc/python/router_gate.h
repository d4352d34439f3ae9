// RouterGate (router_gate.cc): the lock a Python communicator's calls run under, with the one
// fact the hot path's entries ask before a call, whether the CPU ring is open, held beside it.
// Python uses it as a threading.Lock; the entries take it in C without a Python call (a
// threading.Lock's acquire() parses its arguments on every call, ~0.1 us of a small collective).
#pragma once

#include <Python.h>

namespace ringcomm::python {

// Whether `object` is a RouterGate.
bool isRouterGate(PyObject* object);

// Takes the gate: at once when it is free, else waiting with the GIL released. False with a
// Python error set when a signal's handler raised while waiting.
bool enterGate(PyObject* gate);
// Leaves a gate this thread entered.
void leaveGate(PyObject* gate);
// Whether the gate's CPU ring is open (set by Python, under the gate).
bool gateRingOpen(PyObject* gate);

}  // namespace ringcomm::python
