#include "python/signal_check.h"

#include "ringcomm/interrupt.h"

namespace ringcomm::python {
namespace {

// The main thread's identity, read from `threading` at install: only that thread runs signal
// handlers, so the check returns at once elsewhere (without taking the interpreter lock).
unsigned long mainThread = 0;
// What a handler raised, until the bindings raise it (guarded by the interpreter lock: only the
// main thread sets it, whoever raises it holds the lock).
PyObject* kept = nullptr;

bool pendingHandlerRaised() {
  if (PyThread_get_thread_ident() != mainThread || !Py_IsInitialized()) return false;
  const PyGILState_STATE state = PyGILState_Ensure();
  const bool raised = PyErr_CheckSignals() != 0;
  if (raised) {
    Py_XDECREF(kept);
    PyObject *type, *traceback;
    PyErr_Fetch(&type, &kept, &traceback);
    PyErr_NormalizeException(&type, &kept, &traceback);
    if (traceback != nullptr) PyException_SetTraceback(kept, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
  }
  PyGILState_Release(state);
  return raised;
}

}  // namespace

void installSignalCheck() {
  PyObject* threading = PyImport_ImportModule("threading");
  PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", nullptr) : nullptr;
  PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : nullptr;
  if (ident != nullptr) mainThread = PyLong_AsUnsignedLong(ident);
  Py_XDECREF(ident);
  Py_XDECREF(main);
  Py_XDECREF(threading);
  if (PyErr_Occurred() || mainThread == 0) {
    PyErr_Clear();  // no main thread to name: waits stay uninterruptible, as before
    return;
  }
  setInterruptCheck(&pendingHandlerRaised);
}

bool restoreHandlerException(const char* what) {
  if (kept == nullptr) return false;
  PyObject* exception = kept;
  kept = nullptr;
  PyObject* note = PyObject_CallMethod(exception, "add_note", "s", what);
  if (note == nullptr) PyErr_Clear();  // before Python 3.11 exceptions have no notes
  Py_XDECREF(note);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception)), exception);
  Py_DECREF(exception);
  return true;
}

}  // namespace ringcomm::python
