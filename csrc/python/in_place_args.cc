// The helpers the hot path's entries (in_place_entry.cc) use: a numpy array's request, read
// straight from the array, and a request run without the GIL.
#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <optional>

#include "python/in_place_args.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

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

}  // namespace ringcomm::python
