// Communicator.all_reduce's entry once its CPU ring is set up: one builtin that runs the common
// call itself (a plain numpy array or contiguous CPU torch tensor, the op by name or member,
// nothing else asked, no trace or profiler listening, no queued call ahead) under the router's lock, and hands every other call,
// as it came, to the checked route: the communicator's Python method. Making the same decision
// in Python costs about a microsecond, as much as a small all_reduce between two cores.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/in_place_args.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

constexpr const char* kCapsule = "ringcomm.AllReduceEntry";

struct Entry {
  std::shared_ptr<Communicator> comm;
  Algorithm algorithm;  // what a call without algorithm= runs
  // (communicator, tensor, op, async_op, wire_dtype, algorithm, replay_tag): the checked route.
  py::object fallback;
  py::object acquire, release, queue, onWorker, last;  // the router's lock, queue, "last"
  py::object tensorType, tensorDtypes;  // torch.Tensor; {torch dtype: _C.DataType}
  std::pair<py::object, py::object> ring;  // (owner, name): set while the ring is open
  std::vector<std::pair<py::object, py::object>> observers;  // (owner, name): set: observe calls
};

Entry& held(PyObject* capsule) {
  return *static_cast<Entry*>(PyCapsule_GetPointer(capsule, kCapsule));
}

// A module's or object's attribute, truthy? -1 on error.
int flag(const py::object& owner, const py::object& name) {
  PyObject* value = PyObject_GetAttr(owner.ptr(), name.ptr());
  if (value == nullptr) return -1;
  const int truth = PyObject_IsTrue(value);
  Py_DECREF(value);
  return truth;
}

// The op of a call the entry runs itself: a RedOp member, or one of kRedOps' lower-case names.
bool plainOp(PyObject* given, RedOp& op) {
  if (enumArgs().op.member(given, op)) return true;
  if (!PyUnicode_CheckExact(given)) return false;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(given, &size);
  if (text == nullptr) return PyErr_Clear(), false;
  for (const RedOpInfo& row : kRedOps)
    if (std::string_view(text, size) == row.name) return op = row.op, true;
  return false;
}

// The tensor attributes the entry reads, interned once (kept for the life of the module).
struct TensorNames {
  PyObject *isCpu, *dtype, *isContiguous, *dataPtr, *numel;
};
const TensorNames& tensorNames() {
  static const TensorNames names{
      PyUnicode_InternFromString("is_cpu"), PyUnicode_InternFromString("dtype"),
      PyUnicode_InternFromString("is_contiguous"), PyUnicode_InternFromString("data_ptr"),
      PyUnicode_InternFromString("numel")};
  return names;
}

PyObject* callMethod(PyObject* object, PyObject* name) {
  return PyObject_VectorcallMethod(name, &object, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
}

// The in-place request on a torch.Tensor (not a subclass) that is on the CPU, contiguous and
// non-empty, of a dtype the ring takes, read through the tensor's own methods (no torch headers
// here); nullopt otherwise, or with a Python error set if one of them raised.
std::optional<CollectiveRequest> tensorRequest(const Entry& e, PyObject* t, RedOp op) {
  if (Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(e.tensorType.ptr())) return std::nullopt;
  auto value = [&](PyObject* read) { return py::reinterpret_steal<py::object>(read); };
  const TensorNames& names = tensorNames();
  const py::object onCpu = value(PyObject_GetAttr(t, names.isCpu));
  if (onCpu.ptr() != Py_True) return std::nullopt;
  const py::object torchType = value(PyObject_GetAttr(t, names.dtype));
  if (!torchType) return std::nullopt;
  PyObject* ours = PyDict_GetItemWithError(e.tensorDtypes.ptr(), torchType.ptr());  // borrowed
  DataType type;
  if (ours == nullptr || !enumArgs().dtype.member(ours, type)) return std::nullopt;
  const py::object contiguous = value(callMethod(t, names.isContiguous));
  if (contiguous.ptr() != Py_True) return std::nullopt;
  const py::object address = value(callMethod(t, names.dataPtr));
  const py::object count = value(callMethod(t, names.numel));
  if (!address || !count) return std::nullopt;
  void* data = PyLong_AsVoidPtr(address.ptr());
  const size_t elements = PyLong_AsSize_t(count.ptr());
  if (PyErr_Occurred() || elements == 0) return std::nullopt;
  return CollectiveRequest{Collective::AllReduce, data, nullptr, elements, type, op, 0,
                           e.algorithm, std::nullopt, 0};
}

// Whether a trace or profiler wants to see every call. -1 on error.
int observed(const Entry& e) {
  for (const auto& [owner, name] : e.observers) {
    const int set = flag(owner, name);
    if (set != 0) return set;
  }
  return 0;
}

// Whether the router may run a call now, with its lock held: its ring is open and no queued
// call is ahead (none queued, or this is the worker running them). -1 on error.
int open(Entry& e) {
  const int ringSetUp = flag(e.ring.first, e.ring.second);
  if (ringSetUp <= 0) return ringSetUp;
  PyObject* last = PyObject_GetAttr(e.queue.ptr(), e.last.ptr());
  if (last == nullptr) return -1;
  const bool queued = last != Py_None;
  Py_DECREF(last);
  if (!queued) return 1;
  PyObject* onWorker = PyObject_CallNoArgs(e.onWorker.ptr());
  if (onWorker == nullptr) return -1;
  const int truth = PyObject_IsTrue(onWorker);
  Py_DECREF(onWorker);
  return truth;
}

// Releases the router's lock, keeping the error a failed call left, if any.
bool unlock(Entry& e) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyObject* done = PyObject_CallNoArgs(e.release.ptr());
  Py_XDECREF(done);
  if (type != nullptr) {
    if (done == nullptr) PyErr_Clear();
    PyErr_Restore(type, value, trace);
    return false;
  }
  return done != nullptr;
}

PyObject* allReduce(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  Entry& e = held(self);
  if (n != 7) {
    PyErr_Format(PyExc_TypeError, "all_reduce entry takes 7 arguments, got %zd", n);
    return nullptr;
  }
  PyObject* array = args[1];
  RedOp op;
  const bool nothingAsked = args[3] == Py_False && args[4] == Py_None && args[5] == Py_None &&
                            args[6] == Py_None && plainOp(args[2], op);
  std::optional<CollectiveRequest> request;
  if (nothingAsked) {
    const int watched = observed(e);
    if (watched < 0) return nullptr;
    if (!watched) {
      request = plainArrayRequest(array, Collective::AllReduce, op, 0, e.algorithm);
      if (!request) request = tensorRequest(e, array, op);
      if (PyErr_Occurred()) return nullptr;
    }
  }
  if (!request) return PyObject_Vectorcall(e.fallback.ptr(), args, n, nullptr);
  PyObject* locked = PyObject_CallNoArgs(e.acquire.ptr());
  if (locked == nullptr) return nullptr;
  Py_DECREF(locked);
  const int now = open(e);
  if (now <= 0) {
    if (!unlock(e) || now < 0) return nullptr;
    return PyObject_Vectorcall(e.fallback.ptr(), args, n, nullptr);
  }
  const bool ran = runReleased(*e.comm, *request);
  if (!unlock(e) || !ran) return nullptr;
  Py_INCREF(array);
  return array;
}

PyMethodDef kAllReduce = {
    "all_reduce_entry", reinterpret_cast<PyCFunction>(allReduce), METH_FASTCALL,
    "(communicator, tensor, op, async_op, wire_dtype, algorithm, replay_tag) -> tensor: "
    "Communicator.all_reduce, run here when nothing more is asked of it, else by `fallback`"};

// (owner, attribute name) with the name interned: read on every call.
std::pair<py::object, py::object> attribute(const py::tuple& pair) {
  py::str name = pair[1];
  PyObject* raw = name.release().ptr();
  PyUnicode_InternInPlace(&raw);
  return {pair[0], py::reinterpret_steal<py::object>(raw)};
}

}  // namespace

py::object allReduceEntry(std::shared_ptr<Communicator> comm, Algorithm algorithm,
                          py::object fallback, py::object lock, py::object queue,
                          py::object onWorker, py::tuple ring, py::tuple observers,
                          py::object tensorType, py::dict tensorDtypes) {
  auto e = std::make_unique<Entry>();
  *e = Entry{std::move(comm), algorithm, std::move(fallback), lock.attr("acquire"),
             lock.attr("release"), std::move(queue), std::move(onWorker),
             attribute(py::make_tuple(py::none(), "last")).second, std::move(tensorType),
             std::move(tensorDtypes), attribute(ring), {}};
  for (py::handle pair : observers) e->observers.push_back(attribute(pair.cast<py::tuple>()));
  py::capsule self(e.get(), kCapsule, [](PyObject* capsule) {
    delete static_cast<Entry*>(PyCapsule_GetPointer(capsule, kCapsule));
  });
  e.release();  // the capsule's now
  PyObject* f = PyCFunction_New(&kAllReduce, self.ptr());
  if (f == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

}  // namespace ringcomm::python
