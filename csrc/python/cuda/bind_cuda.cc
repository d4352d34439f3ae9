// The CUDA part of ringcomm._C: device queries, NCCL loading and the CUDA transport and reducer
// the core Communicator runs. Compiled only with RINGCOMM_WITH_CUDA; needs no CUDA
// header itself.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "python/bindings.h"
#include "ringcomm/error.h"
#include "ringcomm/reducer.h"
#include "ringcomm/transport.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm::python {

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
  py::class_<CudaTransportAndReducer, std::shared_ptr<CudaTransportAndReducer>>(
      m, "CudaTransportAndReducer",
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
             return std::make_shared<CudaTransportAndReducer>(o);
           }),
           // CommOptions' resolved values, every one given (ringcomm/options.py holds the
           // defaults; ringcomm.transport.cuda.ring_arguments maps them).
           py::arg("rank"), py::arg("world_size"), py::arg("device"), py::arg("unique_id"),
           py::arg("slice_bytes"), py::arg("slots"), py::arg("timeout"),
           py::arg("library_hint"), py::arg("library"), py::arg("nccl_sms"),
           py::arg("publish_bytes"), py::arg("cuda_graphs"))
      .def_property_readonly("transport", &CudaTransportAndReducer::transport)
      .def_property_readonly("reducer", &CudaTransportAndReducer::reducer)
      .def("query", &CudaTransportAndReducer::query, release)
      .def("synchronize", &CudaTransportAndReducer::synchronize, py::arg("timeout") = 0.0,
           release)
      .def("abort", &CudaTransportAndReducer::abort, py::arg("why") = "aborted by the user",
           release)
      .def("release", &CudaTransportAndReducer::release, release);
}

}  // namespace ringcomm::python
