// Communicator.all_reduce's and broadcast's entries once the CPU ring is set up: a builtin per
// collective, set on the communicator itself in place of the method, that runs the common call
// (a plain numpy array or contiguous CPU torch tensor, the op or root plain, an algorithm by
// name or none, nothing else asked, no trace or profiler listening, no queued call ahead) under
// the router's gate, and hands every other call, as it came, to the method: the checked route. Making the same decision in Python,
// or even entering a Python frame, costs a fair part of a small collective between two cores.
#include <Python.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/in_place_args.h"
#include "python/router_gate.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

constexpr const char* kCapsule = "ringcomm.InPlaceEntry";

// A keyword a plain call may give: the collective's own argument (`op` or `src`), the
// algorithm's name, or a keyword whose one plain value asks nothing more.
enum class KeywordRole { Given, Algorithm, Plain };
struct Keyword {
  PyObject* name;
  KeywordRole role;
  PyObject* plain;  // KeywordRole::Plain's value
};

struct Entry {
  std::shared_ptr<Communicator> comm;
  Collective collective;       // AllReduce or Broadcast
  Algorithm algorithm;         // what a call without algorithm= runs
  const std::vector<Keyword>* keywords;
  py::object owner;     // a weak reference to the Python communicator (it holds this entry)
  py::object fallback;  // Communicator.all_reduce, the checked route: (owner, *args, **kwargs)
  py::object gate, queue, onWorker, last;  // the router's RouterGate and queue, "last"
  py::object tensorType, tensorDtypes;  // torch.Tensor; {torch dtype: _C.DataType}
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

// The row of a table (kRedOps, kAlgorithms) that `given`, an exact str, names; null for
// anything else (no error left set).
template <typename Table>
auto namedRow(const Table& table, PyObject* given) -> decltype(&*std::begin(table)) {
  if (!PyUnicode_CheckExact(given)) return nullptr;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(given, &size);
  if (text == nullptr) return PyErr_Clear(), nullptr;
  for (const auto& row : table)
    if (std::string_view(text, size) == row.name) return &row;
  return nullptr;
}

// The op of a call the entry runs itself: a RedOp member, or one of kRedOps' lower-case names.
bool plainOp(PyObject* given, RedOp& op) {
  if (enumArgs().op.member(given, op)) return true;
  const RedOpInfo* row = namedRow(kRedOps, given);
  return row != nullptr && (op = row->op, true);
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
std::optional<CollectiveRequest> tensorRequest(const Entry& e, PyObject* t, RedOp op, int root,
                                              Algorithm algorithm) {
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
  return CollectiveRequest{e.collective, data, nullptr, elements, type, op, root, algorithm,
                           std::nullopt, 0};
}

// Whether a trace or profiler wants to see every call. -1 on error.
int observed(const Entry& e) {
  for (const auto& [owner, name] : e.observers) {
    const int set = flag(owner, name);
    if (set != 0) return set;
  }
  return 0;
}

// Whether the router may run a call now, with its gate held: its ring is open and no queued
// call is ahead (none queued, or this is the worker running them). -1 on error.
int open(Entry& e) {
  if (!gateRingOpen(e.gate.ptr())) return 0;
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

// The algorithm a call names: None (the communicator's default) or one of kAlgorithms' names
// (what checks.algorithm takes); false for anything else (the method says what is wrong).
bool plainAlgorithm(PyObject* given, Algorithm& algorithm) {
  if (given == Py_None) return true;
  const AlgorithmInfo* row = namedRow(kAlgorithms, given);
  return row != nullptr && (algorithm = row->algorithm, true);
}

// A broadcast's root given as a plain int of the world: false for anything else (the method
// says what is wrong with it).
bool plainRoot(const Entry& e, PyObject* given, int& root) {
  if (!PyLong_CheckExact(given)) return false;
  const long value = PyLong_AsLong(given);
  if (value == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
  if (value < 0 || value >= e.comm->worldSize()) return false;
  return root = static_cast<int>(value), true;
}

// The op (all_reduce) or root (broadcast), and the algorithm, of a call that asks nothing more
// than (tensor[, op or src][, algorithm=]) of the collective, found among its arguments; false
// for any other call (extra arguments, other values, unknown keywords).
bool plainCall(const Entry& e, PyObject* const* args, Py_ssize_t n, PyObject* kwnames, RedOp& op,
               int& root, Algorithm& algorithm) {
  algorithm = e.algorithm;
  if (n < 1 || n > 2) return false;
  PyObject* given = n == 2 ? args[1] : nullptr;
  const Py_ssize_t named = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < named; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    PyObject* value = args[n + i];
    const Keyword* match = nullptr;
    for (const Keyword& k : *e.keywords)
      if (k.name == name) match = &k;  // the call site's names are interned: found by identity
    for (const Keyword& k : *e.keywords)
      if (match == nullptr && PyUnicode_Compare(k.name, name) == 0) match = &k;
    if (match == nullptr) return false;
    if (match->role == KeywordRole::Given) {
      if (given != nullptr) return false;  // given twice: Python's own error, from the method
      given = value;
    } else if (match->role == KeywordRole::Algorithm) {
      if (!plainAlgorithm(value, algorithm)) return false;
    } else if (value != match->plain) {
      return false;
    }
  }
  op = RedOp::Sum, root = 0;
  if (given == nullptr) return true;
  return e.collective == Collective::Broadcast ? plainRoot(e, given, root) : plainOp(given, op);
}

// The method's call, with the arguments as they came: (owner, *args, **kwargs).
PyObject* handOn(Entry& e, PyObject* const* args, Py_ssize_t n, PyObject* kwnames) {
  PyObject* owner = PyWeakref_GetObject(e.owner.ptr());  // borrowed
  if (owner == nullptr) return nullptr;
  if (owner == Py_None) {
    PyErr_SetString(PyExc_ReferenceError, "this all_reduce's ringcomm communicator is gone");
    return nullptr;
  }
  const Py_ssize_t total = n + (kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames));
  std::vector<PyObject*> all(total + 1);
  all[0] = owner;
  std::copy(args, args + total, all.begin() + 1);
  Py_INCREF(owner);
  PyObject* result = PyObject_Vectorcall(e.fallback.ptr(), all.data(), n + 1, kwnames);
  Py_DECREF(owner);
  return result;
}

PyObject* runInPlace(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Entry& e = held(self);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  RedOp op;
  int root;
  Algorithm algorithm;
  std::optional<CollectiveRequest> request;
  if (plainCall(e, args, n, kwnames, op, root, algorithm)) {
    const int watched = observed(e);
    if (watched < 0) return nullptr;
    if (!watched) {
      request = plainArrayRequest(args[0], e.collective, op, root, algorithm);
      if (!request) request = tensorRequest(e, args[0], op, root, algorithm);
      if (PyErr_Occurred()) return nullptr;
    }
  }
  if (!request) return handOn(e, args, n, kwnames);
  if (!enterGate(e.gate.ptr())) return nullptr;
  const int now = open(e);
  if (now <= 0) {
    leaveGate(e.gate.ptr());
    if (now < 0) return nullptr;
    return handOn(e, args, n, kwnames);
  }
  const bool ran = runReleased(*e.comm, *request);
  leaveGate(e.gate.ptr());
  if (!ran) return nullptr;
  Py_INCREF(args[0]);
  return args[0];
}

PyMethodDef kAllReduce = {
    "all_reduce", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(runInPlace)),
    METH_FASTCALL | METH_KEYWORDS,
    "all_reduce(tensor, op='sum', *, async_op=False, wire_dtype=None, algorithm=None, "
    "replay_tag=None)\n--\n\n"
    "Communicator.all_reduce on this communicator's CPU ring: a call that asks nothing more "
    "runs here at once, any other goes to the method as it came (see its documentation)."};
PyMethodDef kBroadcast = {
    "broadcast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(runInPlace)),
    METH_FASTCALL | METH_KEYWORDS,
    "broadcast(tensor, src=0, *, async_op=False)\n--\n\n"
    "Communicator.broadcast on this communicator's CPU ring: a call that asks nothing more "
    "runs here at once, any other goes to the method as it came (see its documentation)."};

PyObject* interned(const char* name) { return PyUnicode_InternFromString(name); }

// Each collective's keywords, made once (kept for the life of the module).
const std::vector<Keyword>& keywordsOf(Collective collective) {
  constexpr KeywordRole given = KeywordRole::Given, plain = KeywordRole::Plain;
  static const std::vector<Keyword> broadcast{{interned("src"), given, nullptr},
                                              {interned("async_op"), plain, Py_False}};
  static const std::vector<Keyword> allReduce{
      {interned("op"), given, nullptr}, {interned("async_op"), plain, Py_False},
      {interned("wire_dtype"), plain, Py_None},
      {interned("algorithm"), KeywordRole::Algorithm, nullptr},
      {interned("replay_tag"), plain, Py_None}};
  return collective == Collective::Broadcast ? broadcast : allReduce;
}

// (owner, attribute name) with the name interned: read on every call.
std::pair<py::object, py::object> attribute(const py::tuple& pair) {
  py::str name = pair[1];
  PyObject* raw = name.release().ptr();
  PyUnicode_InternInPlace(&raw);
  return {pair[0], py::reinterpret_steal<py::object>(raw)};
}

}  // namespace

py::object inPlaceEntry(std::shared_ptr<Communicator> comm, Collective collective,
                        Algorithm algorithm, py::object owner, py::object fallback,
                        py::object gate, py::object queue, py::object onWorker,
                        py::tuple observers, py::object tensorType, py::dict tensorDtypes) {
  if (collective != Collective::AllReduce && collective != Collective::Broadcast)
    throw py::value_error("in_place_entry: all_reduce or broadcast only");
  if (!isRouterGate(gate.ptr())) throw py::type_error("in_place_entry: gate is not a RouterGate");
  auto e = std::make_unique<Entry>();
  PyObject* weak = PyWeakref_NewRef(owner.ptr(), nullptr);
  if (weak == nullptr) throw py::error_already_set();
  *e = Entry{std::move(comm), collective, algorithm, &keywordsOf(collective),
             py::reinterpret_steal<py::object>(weak),
             std::move(fallback), std::move(gate), std::move(queue), std::move(onWorker),
             attribute(py::make_tuple(py::none(), "last")).second, std::move(tensorType),
             std::move(tensorDtypes), {}};
  for (py::handle pair : observers) e->observers.push_back(attribute(pair.cast<py::tuple>()));
  py::capsule self(e.get(), kCapsule, [](PyObject* capsule) {
    delete static_cast<Entry*>(PyCapsule_GetPointer(capsule, kCapsule));
  });
  e.release();  // the capsule's now
  PyMethodDef* def = collective == Collective::Broadcast ? &kBroadcast : &kAllReduce;
  PyObject* f = PyCFunction_New(def, self.ptr());
  if (f == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(f);
}

}  // namespace ringcomm::python
