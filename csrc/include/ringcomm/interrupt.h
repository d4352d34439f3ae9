// Interrupting waits. A process asked to stop (Ctrl-C's SIGINT, a SIGTERM with a handler) must
// not sit in a wait for a peer that may never come. The core does not see signals the way its
// embedder handles them (Python runs a signal's handler later, on its main thread, with its
// lock held), so the embedder installs a check that the waits call from their slow phase (a few
// times a second at least): it returns true when the wait is to end, and the wait then raises
// InterruptedError (error.h), which fails the collective like any error: the communicator
// refuses further use and its peers get a PeerError naming this rank. Without a check installed
// nothing is ever interrupted.
#pragma once

namespace ringcomm {

// Called by a waiting thread, with no lock of the core held; may be called from any thread
// (a check that only one thread can answer returns false on the others).
using InterruptCheck = bool (*)();

void setInterruptCheck(InterruptCheck check);  // nullptr removes it
bool interruptRequested();                     // the installed check's answer; false without one

}  // namespace ringcomm
