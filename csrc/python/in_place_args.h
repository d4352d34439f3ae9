// What the hot path's builtins (in_place_entry.cc) use: reading their arguments without
// pybind's dispatcher, and running a request without the GIL (in_place_args.cc). pybind
// matches every overload's arguments and converts each enum through its type registry: ~1 us
// per call, as much as a small all_reduce itself. Here enum members are found by identity.
#pragma once

#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <iterator>
#include <optional>
#include <typeinfo>

#include "ringcomm/communicator.h"

namespace ringcomm::python {

// An enum argument's members. pybind's enum members are singletons (`_C.RedOp.sum` is always
// the same object), so a member is found by identity in a few compares; anything else is not a
// plain argument (the method converts it, or says what is wrong with it).
template <typename Enum, size_t N>
class EnumArg {
 public:
  EnumArg() {
    namespace py = pybind11;
    const py::handle type = py::detail::get_type_handle(typeid(Enum), /*throw_if_missing=*/true);
    for (auto item : type.attr("__members__").template cast<py::dict>()) {
      const auto value = static_cast<size_t>(item.second.template cast<Enum>());
      if (value < N) members_[value] = item.second.ptr();  // kept alive by the enum's class
    }
  }

  // Whether `given` is one of the members themselves (no conversion, no error).
  bool member(PyObject* given, Enum& out) const {
    for (size_t i = 0; i < N; ++i)
      if (members_[i] == given) return out = static_cast<Enum>(i), true;
    return false;
  }

 private:
  std::array<PyObject*, N> members_{};
};

struct EnumArgs {
  EnumArg<DataType, std::size(kDataTypes)> dtype;
  EnumArg<RedOp, std::size(kRedOps)> op;
};

// Made on first use, with the GIL (the enums are registered by then); lives as long as the module.
const EnumArgs& enumArgs();

// The in-place request on `array` when it is a contiguous, writable, non-empty numpy array of a
// dtype the ring takes as it is (native byte order); nullopt, with no error set, otherwise.
std::optional<CollectiveRequest> plainArrayRequest(PyObject* array, Collective collective,
                                                   RedOp op, int root, Algorithm algorithm);

// Runs `request` without the GIL: true once it ran; false with the C++ error turned into the
// module's Python exception.
bool runReleased(Communicator& comm, const CollectiveRequest& request);

}  // namespace ringcomm::python
