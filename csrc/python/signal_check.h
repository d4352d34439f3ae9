// Ctrl-C for the C++ core's waits, on Python's terms. Python's own C handler only notes that a
// signal arrived; the Python handler (KeyboardInterrupt for SIGINT, whatever the program set
// for SIGTERM) runs later, on the main thread, with the interpreter lock. The check installed
// here as the core's interrupt hook (ringcomm/interrupt.h) does that from a waiting main
// thread: it takes the lock and runs the pending handlers; a handler that raises ends the wait
// (InterruptedError in the core), one that returns lets it go on. The exception the handler
// raised is kept for the bindings to raise in place of the core's error.
#pragma once

#include <Python.h>

namespace ringcomm::python {

// Installs the check (at import, with the interpreter lock held).
void installSignalCheck();

// With the interpreter lock held: sets the exception a handler raised during a wait as the
// current Python error, with `what` (the core's message) added as a note, and returns true;
// false when none is kept.
bool restoreHandlerException(const char* what);

}  // namespace ringcomm::python
