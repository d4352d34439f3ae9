// _C.RouterGate: a lock for Python (acquire, release, `with`, locked) written against the C API,
// with the `ring_open` flag the in-place entries read (router_gate.h). Not pybind: its
// dispatcher would cost more than the lock itself.
#include "python/router_gate.h"

#include <pybind11/pybind11.h>

#include "python/bindings.h"

namespace ringcomm::python {
namespace {

struct Gate {
  PyObject_HEAD
  PyThread_type_lock lock;
  bool held;      // taken by some thread (a lock, not reentrant)
  bool ringOpen;  // the CPU ring is set up and not closed
};

PyTypeObject gateType = {PyVarObject_HEAD_INIT(nullptr, 0)};

Gate* asGate(PyObject* object) { return reinterpret_cast<Gate*>(object); }

PyObject* gateNew(PyTypeObject* type, PyObject*, PyObject*) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  Gate* g = asGate(self);
  g->lock = PyThread_allocate_lock();
  g->held = g->ringOpen = false;
  if (g->lock == nullptr) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return self;
}

void gateDealloc(PyObject* self) {
  Gate* g = asGate(self);
  if (g->lock != nullptr) {
    if (g->held) PyThread_release_lock(g->lock);  // freeing a held lock is undefined
    PyThread_free_lock(g->lock);
  }
  Py_TYPE(self)->tp_free(self);
}

PyObject* acquire(PyObject* self, PyObject*) {
  if (!enterGate(self)) return nullptr;
  Py_RETURN_TRUE;
}

PyObject* release(PyObject* self, PyObject*) {
  if (!asGate(self)->held) {
    PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
    return nullptr;
  }
  leaveGate(self);
  Py_RETURN_NONE;
}

PyObject* exit(PyObject* self, PyObject*) { return release(self, nullptr); }

PyObject* locked(PyObject* self, PyObject*) { return PyBool_FromLong(asGate(self)->held); }

PyObject* getRingOpen(PyObject* self, void*) { return PyBool_FromLong(asGate(self)->ringOpen); }

int setRingOpen(PyObject* self, PyObject* value, void*) {
  const int truth = value == nullptr ? 0 : PyObject_IsTrue(value);
  if (truth < 0) return -1;
  asGate(self)->ringOpen = truth != 0;
  return 0;
}

PyMethodDef gateMethods[] = {
    {"acquire", acquire, METH_NOARGS, "Takes the gate, waiting (GIL released) while another holds it."},
    {"release", release, METH_NOARGS, "Gives the gate back."},
    {"locked", locked, METH_NOARGS, "Whether some thread holds the gate."},
    {"__enter__", acquire, METH_NOARGS, nullptr},
    {"__exit__", exit, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr}};

PyGetSetDef gateFields[] = {
    {"ring_open", getRingOpen, setRingOpen,
     "Whether the CPU ring is set up and not closed: the in-place entries run calls only then.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

}  // namespace

bool isRouterGate(PyObject* object) { return Py_TYPE(object) == &gateType; }

bool enterGate(PyObject* gate) {
  Gate* g = asGate(gate);
  if (PyThread_acquire_lock(g->lock, NOWAIT_LOCK)) return g->held = true, true;
  // Held by another thread (an asynchronous call's worker may hold it for a whole collective):
  // wait without the GIL, in slices that let this thread's signal handlers run, as
  // threading.Lock does.
  for (;;) {
    PyLockStatus status;
    Py_BEGIN_ALLOW_THREADS
    status = PyThread_acquire_lock_timed(g->lock, -1, /*intr_flag=*/1);
    Py_END_ALLOW_THREADS
    if (status == PY_LOCK_ACQUIRED) return g->held = true, true;
    if (PyErr_CheckSignals() < 0) return false;
  }
}

void leaveGate(PyObject* gate) {
  Gate* g = asGate(gate);
  g->held = false;
  PyThread_release_lock(g->lock);
}

bool gateRingOpen(PyObject* gate) { return asGate(gate)->ringOpen; }

void bindRouterGate(pybind11::module_& m) {
  gateType.tp_name = "ringcomm._C.RouterGate";
  gateType.tp_basicsize = sizeof(Gate);
  gateType.tp_flags = Py_TPFLAGS_DEFAULT;
  gateType.tp_doc =
      "RouterGate(): the lock a communicator's calls run under (acquire, release, `with`), "
      "and ring_open, which the in-place entries read without a Python call.";
  gateType.tp_new = gateNew;
  gateType.tp_dealloc = gateDealloc;
  gateType.tp_methods = gateMethods;
  gateType.tp_getset = gateFields;
  if (PyType_Ready(&gateType) < 0) throw pybind11::error_already_set();
  Py_INCREF(&gateType);
  m.add_object("RouterGate", reinterpret_cast<PyObject*>(&gateType));
}

}  // namespace ringcomm::python
