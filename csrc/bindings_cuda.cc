// The CUDA part of ringcomm._C: device queries, NCCL loading, kernel test entry points and the
// CUDA ring (transport and reducer) the core Communicator runs. Compiled only with RINGCOMM_WITH_CUDA; needs no CUDA header itself.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "ringcomm/error.h"
#include "ringcomm/reducer.h"
#include "ringcomm/transport.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm {

void bindHostGpu(py::module_& testing);  // csrc/testing/cuda/bindings_host_gpu.cc

void bindCuda(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def("cuda_available", &cudaAvailable, "Whether a CUDA device is usable (False without a driver)");
  m.def("device_count", &cudaDeviceCount);
  m.def("cuda_unavailable_reason", &cudaUnavailableReason,
        "Why no CUDA device is usable, naming the CUDA error (\"\" when one is)");
  m.def("nccl_library", [](const std::string& library, const std::string& hint) {
        return py::make_tuple(ncclLibraryPath(library, hint), ncclRuntimeVersion(library, hint));
      }, py::arg("library"), py::arg("hint"),
      "(path, version code) of the NCCL library ringcomm loads");
  m.def("nccl_unique_id", [](const std::string& library, const std::string& hint) {
        return py::bytes(makeNcclUniqueId(library, hint));
      }, py::arg("library"), py::arg("hint"));
  // Kernel entry points for tests and benchmarks only (bindings.cc made the submodule).
  auto testing = m.attr("testing").cast<py::module_>();
  bindHostGpu(testing);
  testing.def("reduce_kernel",
        [](uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n, DataType type,
           RedOp op, int divisor, bool finalize, uintptr_t stream,
           std::optional<DataType> wire, int smsForNccl) {
          std::string why;  // collectives check this in Communicator::prepare
          RC_CHECK(opSupported(op, type, &why), why);
          reduceOnDevice(out0, out1, a, b, n, type, op, divisor, finalize, stream,
                         wire.value_or(type), smsForNccl);
        },
        py::arg("out0"), py::arg("out1"), py::arg("a"), py::arg("b"), py::arg("n"),
        py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
        py::arg("stream") = 0, py::arg("wire_dtype") = py::none(),
        py::arg("nccl_sms"), release,
        "Enqueues out0/out1 = op(a, b) on the current device; pointers are device addresses. "
        "With wire_dtype (float16/bfloat16 under float32), out1 and b are in wire_dtype");
  testing.def("convert_kernel", &convertOnDevice, py::arg("out0"), py::arg("out1"), py::arg("src"),
        py::arg("src_is_wire"), py::arg("n"), py::arg("wire_dtype"), py::arg("stream") = 0,
        py::arg("nccl_sms"), release,
        "Enqueues out0 (float32) and out1 (wire_dtype) = src, which is in wire_dtype when "
        "src_is_wire");
  testing.def("copy_kernel", &copyOnDevice, py::arg("out0"), py::arg("out1"), py::arg("src"),
        py::arg("bytes"), py::arg("stream") = 0, release);

  testing.def("publication_round", &publicationRound, py::arg("ring"), py::arg("rank"),
              py::arg("stream"), py::arg("sources"), py::arg("bytes_per_rank"),
              py::arg("outputs"), release,
              "One round of the NCCL transport's publications (sources[phase] published, every "
              "rank's copied to outputs[phase][rank]), as a one-hop plan runs it");

  py::class_<CudaRing, std::shared_ptr<CudaRing>>(
      m, "CudaRing",
      "The NCCL transport and CUDA reducer of a communicator on one GPU; pass .transport and "
      ".reducer to Communicator. Every rank of the ring constructs it together. publish_bytes: "
      "the largest publication of the one-hop algorithms (one_shot, two_shot) per rank and "
      "phase, exchanged over NCCL; costs (2 x world_size + 2) x publish_bytes of device memory; "
      "0 offers the ring only")
      .def(py::init([](int rank, int worldSize, int device, const py::bytes& uniqueId,
                       size_t sliceBytes, int slots, double timeout, const std::string& hint,
                       const std::string& library, int smsForNccl,
                       size_t publishBytes, bool cudaGraphs) {
             CudaTransportOptions o;
             o.rank = rank;
             o.worldSize = worldSize;
             o.device = device;
             o.uniqueId = uniqueId;
             o.slotBytes = sliceBytes;
             o.slots = slots;
             o.timeoutSeconds = timeout;
             o.libraryHint = hint;
             o.library = library;
             o.smsForNccl = smsForNccl;
             o.publishBytes = publishBytes;
             o.recordGraphs = cudaGraphs;
             py::gil_scoped_release unlocked;  // NCCL init waits for every rank
             return std::make_shared<CudaRing>(o);
           }),
           // CommOptions' resolved values, every one given (ringcomm/options.py holds the
           // defaults; ringcomm.cuda_backend.ring_arguments maps them).
           py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("unique_id"),
           py::arg("slice_bytes"), py::arg("slots"), py::arg("timeout"),
           py::arg("library_hint"), py::arg("library"), py::arg("nccl_sms"),
           py::arg("publish_bytes"), py::arg("cuda_graphs"))
      .def_property_readonly("transport", &CudaRing::transport)
      .def_property_readonly("reducer", &CudaRing::reducer)
      .def("query", &CudaRing::query, release)
      .def("synchronize", &CudaRing::synchronize, py::arg("timeout") = 0.0, release)
      .def("abort", &CudaRing::abort, py::arg("why") = "aborted by the user", release)
      .def("release", &CudaRing::release, release);
}

}  // namespace ringcomm
