// The hot path's entry for in-place collectives (all_reduce, broadcast) that the router has
// checked: two builtins bound to one communicator, called through CPython's vectorcall protocol
// without pybind's dispatcher (in_place_args.h says why). Also the helpers those builtins and
// all_reduce_entry.cc share.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <optional>

#include "python/bindings.h"
#include "python/in_place_args.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

constexpr const char* kCapsule = "ringcomm.Communicator";

Communicator& held(PyObject* capsule) {
  return **static_cast<std::shared_ptr<Communicator>*>(PyCapsule_GetPointer(capsule, kCapsule));
}

// The DataType of a numpy dtype the ring takes as it is (native byte order), if any.
std::optional<DataType> plainNumpyType(const py::dtype& d) {
  if (d.byteorder() != '=' && d.byteorder() != '|') return std::nullopt;
  const size_t size = static_cast<size_t>(d.itemsize());
  switch (d.kind()) {
    case 'f': return size == 4 ? DataType::Float32 : size == 8 ? DataType::Float64
                   : size == 2 ? std::optional(DataType::Float16) : std::nullopt;
    case 'i': return size == 1 ? DataType::Int8 : size == 4 ? DataType::Int32
                   : size == 8 ? std::optional(DataType::Int64) : std::nullopt;
    case 'u': return size == 1 ? std::optional(DataType::UInt8) : std::nullopt;
    case 'b': return size == 1 ? std::optional(DataType::Bool) : std::nullopt;
    default: return std::nullopt;
  }
}

bool argumentCount(Py_ssize_t given, Py_ssize_t wanted, const char* name) {
  if (given == wanted) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, wanted, given);
  return false;
}

// (collective, array, op, root, algorithm) -> True after running in place on a contiguous,
// writable, non-empty numpy array of a ringcomm dtype; False, running nothing, for anything else.
PyObject* runArray(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!argumentCount(n, 5, "run_array")) return nullptr;
  Collective collective;
  RedOp op;
  Algorithm algorithm;
  const EnumArgs& enums = enumArgs();
  if (!enums.collective(args[0], "collective", collective) || !enums.op(args[2], "op", op) ||
      !enums.algorithm(args[4], "algorithm", algorithm))
    return nullptr;
  const int root = PyLong_AsLong(args[3]);
  if (root == -1 && PyErr_Occurred()) return nullptr;
  const std::optional<CollectiveRequest> request =
      plainArrayRequest(args[1], collective, op, root, algorithm);
  if (!request) Py_RETURN_FALSE;
  if (!runReleased(held(self), *request)) return nullptr;
  Py_RETURN_TRUE;
}

// (collective, address, count, dtype, op, root, algorithm, wire_dtype) -> True after running in
// place on `count` elements at `address` (a CPU tensor's storage the caller checked);
// `wire_dtype`: None or a DataType.
PyObject* runAddress(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  if (!argumentCount(n, 8, "run_address")) return nullptr;
  Collective collective;
  DataType type;
  RedOp op;
  Algorithm algorithm;
  const EnumArgs& enums = enumArgs();
  if (!enums.collective(args[0], "collective", collective) ||
      !enums.dtype(args[3], "dtype", type) || !enums.op(args[4], "op", op) ||
      !enums.algorithm(args[6], "algorithm", algorithm))
    return nullptr;
  std::optional<DataType> wire;
  if (args[7] != Py_None && !enums.dtype(args[7], "wire_dtype", wire.emplace())) return nullptr;
  void* data = PyLong_AsVoidPtr(args[1]);
  const size_t count = PyLong_AsSize_t(args[2]);
  const int root = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  if (!runReleased(held(self), CollectiveRequest{collective, data, nullptr, count, type, op, root,
                                                algorithm, wire, 0}))
    return nullptr;
  Py_RETURN_TRUE;
}

PyMethodDef kRunArray = {"run_array", reinterpret_cast<PyCFunction>(runArray), METH_FASTCALL,
                         "(collective, array, op, root, algorithm) -> bool: an in-place "
                         "collective on a plain numpy array, or False"};
PyMethodDef kRunAddress = {"run_address", reinterpret_cast<PyCFunction>(runAddress),
                           METH_FASTCALL,
                           "(collective, address, count, dtype, op, root, algorithm, wire_dtype) -> "
                           "True: an in-place collective on a CPU buffer"};

}  // namespace

const EnumArgs& enumArgs() {
  static const EnumArgs* enums = new EnumArgs();  // never freed: the module is never unloaded
  return *enums;
}

std::optional<CollectiveRequest> plainArrayRequest(PyObject* array, Collective collective,
                                                   RedOp op, int root, Algorithm algorithm) {
  if (!py::isinstance<py::array>(array)) return std::nullopt;
  auto a = py::reinterpret_borrow<py::array>(array);
  if (!(a.flags() & py::array::c_style) || !a.writeable() || a.size() == 0) return std::nullopt;
  const std::optional<DataType> type = plainNumpyType(a.dtype());
  if (!type) return std::nullopt;
  return CollectiveRequest{collective, a.mutable_data(), nullptr, static_cast<size_t>(a.size()),
                           *type, op, root, algorithm, std::nullopt, 0};
}

bool runReleased(Communicator& comm, const CollectiveRequest& request) {
  try {
    PyThreadState* state = PyEval_SaveThread();
    try {
      comm.run(request);
    } catch (...) {
      PyEval_RestoreThread(state);
      throw;
    }
    PyEval_RestoreThread(state);
  } catch (...) {
    py::detail::try_translate_exceptions();
    return false;
  }
  return true;
}

py::tuple inPlaceRunners(std::shared_ptr<Communicator> comm) {
  auto* owned = new std::shared_ptr<Communicator>(std::move(comm));
  py::capsule self(owned, kCapsule, [](PyObject* capsule) {
    delete static_cast<std::shared_ptr<Communicator>*>(PyCapsule_GetPointer(capsule, kCapsule));
  });
  auto bind = [&](PyMethodDef& def) {
    PyObject* f = PyCFunction_New(&def, self.ptr());
    if (f == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(f);
  };
  return py::make_tuple(bind(kRunArray), bind(kRunAddress));
}

}  // namespace ringcomm::python
