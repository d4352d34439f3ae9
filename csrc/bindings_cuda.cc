// The CUDA part of ringcomm._C: device queries, NCCL loading, kernel test entry points and the
// CUDA communicator. Compiled only with RINGCOMM_WITH_CUDA; needs no CUDA header itself.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/cuda_backend.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

}  // namespace

void bindCuda(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def("cuda_available", &cudaAvailable, "Whether a CUDA device is usable (False without a driver)");
  m.def("device_count", &cudaDeviceCount);
  m.def("nccl_header_version", &ncclHeaderVersion);
  m.def("nccl_library", [](const std::string& hint) {
        return py::make_tuple(ncclLibraryPath(hint), ncclRuntimeVersion(hint));
      }, py::arg("hint") = "", "(path, version code) of the NCCL library ringcomm loads");
  m.def("nccl_unique_id", [](const std::string& hint) {
        return py::bytes(makeNcclUniqueId(hint));
      }, py::arg("hint") = "");
  m.def("reduce_kernel",
        [](uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n, DataType type,
           RedOp op, int divisor, bool finalize, float scale, uintptr_t stream,
           std::optional<DataType> wire) {
          reduceOnDevice(out0, out1, a, b, n, type, op, divisor, finalize, scale, stream,
                         wire.value_or(type));
        },
        py::arg("out0"), py::arg("out1"), py::arg("a"), py::arg("b"), py::arg("n"),
        py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
        py::arg("scale") = 1.0f, py::arg("stream") = 0, py::arg("wire_dtype") = py::none(),
        release,
        "Enqueues out0/out1 = op(a, b) on the current device; pointers are device addresses. "
        "With wire_dtype (float16/bfloat16 under float32), out1 and b are in wire_dtype");
  m.def("convert_kernel", &convertOnDevice, py::arg("out0"), py::arg("out1"), py::arg("src"),
        py::arg("src_is_wire"), py::arg("n"), py::arg("wire_dtype"), py::arg("stream") = 0,
        release,
        "Enqueues out0 (float32) and out1 (wire_dtype) = src, which is in wire_dtype when "
        "src_is_wire");
  m.def("copy_kernel", &copyOnDevice, py::arg("out0"), py::arg("out1"), py::arg("src"),
        py::arg("bytes"), py::arg("stream") = 0, release);

  using Comm = CudaCommunicator;
  py::class_<Comm, std::shared_ptr<Comm>>(m, "CudaCommunicator")
      .def(py::init([](int rank, int worldSize, int device, const py::bytes& uniqueId,
                       size_t sliceBytes, int slots, double timeout, const std::string& hint) {
             CudaCommunicatorOptions o;
             o.rank = rank;
             o.worldSize = worldSize;
             o.device = device;
             o.uniqueId = uniqueId;
             o.sliceBytes = sliceBytes;
             o.slots = slots;
             o.timeoutSeconds = timeout;
             o.libraryHint = hint;
             py::gil_scoped_release unlocked;  // NCCL init waits for every rank
             return std::make_shared<Comm>(o);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("unique_id"),
           py::arg("slice_bytes") = 4 << 20, py::arg("slots") = 4, py::arg("timeout") = 600.0,
           py::arg("library_hint") = "")
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::worldSize)
      .def_property_readonly("device", &Comm::device)
      .def_property_readonly("sequence", &Comm::sequence)
      .def("all_reduce",
           [](Comm& c, uintptr_t data, size_t n, DataType t, RedOp op, uintptr_t stream,
              float scale, std::optional<DataType> wire) {
             c.allReduce(address(data), n, t, op, stream, scale, wire.value_or(t));
           },
           py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("op"), py::arg("stream") = 0,
           py::arg("scale") = 1.0f, py::arg("wire_dtype") = py::none(), release)
      .def("reduce_scatter",
           [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, RedOp op,
              uintptr_t stream) { c.reduceScatter(address(out), address(in), n, t, op, stream); },
           py::arg("output"), py::arg("input"), py::arg("n"), py::arg("dtype"), py::arg("op"),
           py::arg("stream") = 0, release)
      .def("all_gather",
           [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, uintptr_t stream) {
             c.allGather(address(out), address(in), n, t, stream);
           },
           py::arg("output"), py::arg("input"), py::arg("n"), py::arg("dtype"),
           py::arg("stream") = 0, release)
      .def("broadcast",
           [](Comm& c, uintptr_t data, size_t n, DataType t, int src, uintptr_t stream) {
             c.broadcast(address(data), n, t, src, stream);
           },
           py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("src"),
           py::arg("stream") = 0, release)
      .def("reduce",
           [](Comm& c, uintptr_t data, size_t n, DataType t, RedOp op, int dst,
              uintptr_t stream) { c.reduce(address(data), n, t, op, dst, stream); },
           py::arg("data"), py::arg("n"), py::arg("dtype"), py::arg("op"), py::arg("dst"),
           py::arg("stream") = 0, release)
      .def("gather",
           [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, int dst,
              uintptr_t stream) { c.gather(address(out), address(in), n, t, dst, stream); },
           py::arg("output"), py::arg("input"), py::arg("n"), py::arg("dtype"), py::arg("dst"),
           py::arg("stream") = 0, release)
      .def("scatter",
           [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, int src,
              uintptr_t stream) { c.scatter(address(out), address(in), n, t, src, stream); },
           py::arg("output"), py::arg("input"), py::arg("n"), py::arg("dtype"), py::arg("src"),
           py::arg("stream") = 0, release)
      .def("query", &Comm::query, release)
      .def("synchronize", &Comm::synchronize, py::arg("timeout") = 0.0, release)
      .def("abort", &Comm::abort, py::arg("why") = "aborted by the user", release)
      .def("close", &Comm::close, release);
}

}  // namespace ringcomm
