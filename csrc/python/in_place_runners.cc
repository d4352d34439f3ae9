// The hot path's entry: two builtins bound to one communicator that run an in-place collective
// (all_reduce, broadcast) through CPython's vectorcall protocol, without pybind's dispatcher.
// pybind matches every overload's arguments and converts each enum through its type registry:
// ~1 us per call, as much as a small all_reduce itself. Here enum members are found by identity
// and integers read as they are, each checked against its table.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <typeinfo>

#include "python/bindings.h"
#include "ringcomm/communicator.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

constexpr const char* kCapsule = "ringcomm.Communicator";

Communicator& held(PyObject* capsule) {
  return **static_cast<std::shared_ptr<Communicator>*>(PyCapsule_GetPointer(capsule, kCapsule));
}

// An enum argument's value. pybind's enum members are singletons (`_C.RedOp.sum` is always the
// same object), so a member is found by identity in a few compares; any other instance, or a
// plain int, is converted and checked against the table's size. False (Python error set) when
// the argument is none of these.
template <typename Enum, size_t N>
class EnumArg {
 public:
  EnumArg() {
    const py::handle type = py::detail::get_type_handle(typeid(Enum), /*throw_if_missing=*/true);
    for (auto item : type.attr("__members__").template cast<py::dict>()) {
      const auto value = static_cast<size_t>(item.second.template cast<Enum>());
      if (value < N) members_[value] = item.second.ptr();  // kept alive by the enum's class
    }
  }

  bool operator()(PyObject* given, const char* what, Enum& out) const {
    for (size_t i = 0; i < N; ++i)
      if (members_[i] == given) return out = static_cast<Enum>(i), true;
    long value = -1;
    if (PyLong_Check(given)) {
      value = PyLong_AsLong(given);
      if (value == -1 && PyErr_Occurred()) return false;
    } else {
      try {
        value = static_cast<long>(py::cast<Enum>(py::handle(given)));
      } catch (const py::cast_error&) {
      }
    }
    if (value < 0 || value >= static_cast<long>(N)) {
      PyErr_Format(PyExc_TypeError, "%s: expected ringcomm._C's enum or its value, got %R",
                   what, given);
      return false;
    }
    out = static_cast<Enum>(value);
    return true;
  }

 private:
  std::array<PyObject*, N> members_{};
};

// Made once, with the GIL, when the first runners are made (the enums are registered by then).
struct EnumArgs {
  EnumArg<Collective, std::size(kCollectives)> collective;
  EnumArg<DataType, std::size(kDataTypes)> dtype;
  EnumArg<RedOp, std::size(kRedOps)> op;
  EnumArg<Algorithm, std::size(kAlgorithms)> algorithm;
};
const EnumArgs* enums = nullptr;

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

// Runs `request` without the GIL; C++ errors become the module's Python exceptions.
PyObject* runReleased(Communicator& comm, const CollectiveRequest& request) {
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
    return nullptr;
  }
  Py_RETURN_TRUE;
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
  if (!enums->collective(args[0], "collective", collective) || !enums->op(args[2], "op", op) ||
      !enums->algorithm(args[4], "algorithm", algorithm))
    return nullptr;
  const int root = PyLong_AsLong(args[3]);
  if (root == -1 && PyErr_Occurred()) return nullptr;
  if (!py::isinstance<py::array>(args[1])) Py_RETURN_FALSE;
  auto a = py::reinterpret_borrow<py::array>(args[1]);
  if (!(a.flags() & py::array::c_style) || !a.writeable() || a.size() == 0) Py_RETURN_FALSE;
  const std::optional<DataType> type = plainNumpyType(a.dtype());
  if (!type) Py_RETURN_FALSE;
  return runReleased(held(self), CollectiveRequest{collective, a.mutable_data(), nullptr,
                                                   static_cast<size_t>(a.size()), *type, op,
                                                   root, algorithm, std::nullopt, 0});
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
  if (!enums->collective(args[0], "collective", collective) ||
      !enums->dtype(args[3], "dtype", type) || !enums->op(args[4], "op", op) ||
      !enums->algorithm(args[6], "algorithm", algorithm))
    return nullptr;
  std::optional<DataType> wire;
  if (args[7] != Py_None && !enums->dtype(args[7], "wire_dtype", wire.emplace())) return nullptr;
  void* data = PyLong_AsVoidPtr(args[1]);
  const size_t count = PyLong_AsSize_t(args[2]);
  const int root = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  return runReleased(held(self), CollectiveRequest{collective, data, nullptr, count, type, op,
                                                   root, algorithm, wire, 0});
}

PyMethodDef kRunArray = {"run_array", reinterpret_cast<PyCFunction>(runArray), METH_FASTCALL,
                         "(collective, array, op, root, algorithm) -> bool: an in-place "
                         "collective on a plain numpy array, or False"};
PyMethodDef kRunAddress = {"run_address", reinterpret_cast<PyCFunction>(runAddress),
                           METH_FASTCALL,
                           "(collective, address, count, dtype, op, root, algorithm, wire_dtype) -> "
                           "True: "
                           "an in-place collective on a CPU buffer"};

}  // namespace

py::tuple inPlaceRunners(std::shared_ptr<Communicator> comm) {
  if (enums == nullptr) enums = new EnumArgs();  // lives as long as the module
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
