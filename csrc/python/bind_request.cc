// ringcomm._C.CollectiveRequest: Communicator::run's argument, with keywords (`dtype`,
// `wire_dtype` as in Python) and raw addresses as integers; and the debug-mode header its
// messages carry.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

std::string describeRequest(const CollectiveRequest& r) {
  std::ostringstream out;
  out << "CollectiveRequest(" << collectiveName(r.collective) << ", output=" << r.output
      << ", input=" << r.input << ", count=" << r.count << ", dtype=" << dataTypeName(r.type)
      << ", op=" << redOpName(r.op) << ", root=" << r.root
      << ", algorithm=" << algorithmName(r.algorithm) << ", wire_dtype="
      << (r.wireType ? dataTypeName(*r.wireType) : "None") << ", stream=" << r.stream
      << ", replay_tag=" << r.replayTag << ")";
  return out.str();
}

// Positional order is the fields'.
void bindRequestClass(py::module_& m) {
  using R = CollectiveRequest;
  py::class_<R>(m, "CollectiveRequest",
                "One collective call for Communicator.run: which collective, its buffers (raw "
                "addresses), count (elements of the in-place tensor, else of this rank's block), "
                "dtype, op, root, algorithm, wire dtype, stream and replay tag")
      .def(py::init([](Collective collective, uintptr_t output, uintptr_t input, size_t count,
                       DataType type, RedOp op, int root, Algorithm algorithm,
                       std::optional<DataType> wireType, uintptr_t stream, int64_t replayTag) {
             R r{collective, address(output), address(input), count, type, op, root,
                 algorithm, wireType, stream};
             r.replayTag = replayTag;
             return r;
           }),
           py::arg("collective"), py::arg("output") = 0, py::arg("input") = 0,
           py::arg("count") = 0, py::arg("dtype") = DataType::Float32,
           py::arg("op") = RedOp::Sum, py::arg("root") = 0,
           py::arg("algorithm") = Algorithm::Ring, py::arg("wire_dtype") = py::none(),
           py::arg("stream") = 0, py::arg("replay_tag") = -1)
      .def_readwrite("collective", &R::collective)
      .def_property(
          "output", [](const R& r) { return reinterpret_cast<uintptr_t>(r.output); },
          [](R& r, uintptr_t value) { r.output = address(value); })
      .def_property(
          "input", [](const R& r) { return reinterpret_cast<uintptr_t>(r.input); },
          [](R& r, uintptr_t value) { r.input = address(value); })
      .def_readwrite("count", &R::count)
      .def_readwrite("dtype", &R::type)
      .def_readwrite("op", &R::op)
      .def_readwrite("root", &R::root)
      .def_readwrite("algorithm", &R::algorithm)
      .def_readwrite("wire_dtype", &R::wireType)
      .def_readwrite("stream", &R::stream)
      .def_readwrite("replay_tag", &R::replayTag)
      .def("__repr__", &describeRequest);
}

// The debug-mode descriptor: the header fields of the C++ Envelope a request's messages carry
// (the algorithm as asked for), as integers to exchange.
void bindCollectiveHeader(py::module_& m) {
  m.def(
      "collective_header",
      [](const CollectiveRequest& r) {
        const Envelope e = collectiveHeader(r.collective, r.count, r.type, r.op, r.root,
                                            r.wireType.value_or(r.type), r.algorithm);
        return std::vector<int64_t>{e.collective, e.dataType, e.op, e.root, e.wireType,
                                    static_cast<int64_t>(e.count), e.algorithm};
      },
      py::arg("request"));
  m.def(
      "describe_collective",
      [](const std::vector<int64_t>& h) {
        RC_CHECK(h.size() == 7, "a collective header has 7 fields, not ", h.size());
        Envelope e = collectiveHeader(static_cast<Collective>(h[0]), static_cast<uint64_t>(h[5]),
                                      static_cast<DataType>(h[1]), static_cast<RedOp>(h[2]),
                                      static_cast<int>(h[3]), static_cast<DataType>(h[4]),
                                      static_cast<Algorithm>(h[6]));
        return describeCollective(e);
      },
      py::arg("header"));
}

}  // namespace

void bindRequest(py::module_& m) {
  bindRequestClass(m);
  bindCollectiveHeader(m);
}

}  // namespace ringcomm::python
