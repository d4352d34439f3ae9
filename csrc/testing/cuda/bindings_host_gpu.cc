// ringcomm._testing.host_gpu: the real NcclTransport over the host implementation of CUDA and
// NCCL (host_gpu.h), reducing with the real CudaReducer and its kernels executed on the CPU
// (kernel_runtime.h), for the CPU tests. Ranks are threads of one process.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "cuda/reduce_kernels.h"
#include "nccl/nccl_transport.h"
#include "ringcomm/error.h"
#include "testing/cuda/host_gpu.h"
#include "testing/cuda/kernel_runtime.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

// The kernels that ship, built for the host (kernel_runtime.h), run as work of the host
// implementation's streams and share its CUDA state (the calling thread's device and last error).
void runKernelsOnHostStreams() {
  static std::once_flag once;
  std::call_once(once, [] {
    hostkern::Runtime& r = hostkern::runtime();
    r.enqueue = [](cudaStream_t stream, std::function<void()> work) {
      hostgpu::launch(stream, std::move(work));
    };
    r.getLastError = [] { return hostgpu::api().cudaGetLastError(); };
    r.getDevice = [](int* device) { return hostgpu::api().cudaGetDevice(device); };
    r.setDevice = [](int device) { return hostgpu::api().cudaSetDevice(device); };
    r.exchangeCaptureMode = [](cudaStreamCaptureMode* mode) {
      return hostgpu::api().cudaThreadExchangeStreamCaptureMode(mode);
    };
  });
}

// What a communicator over the host implementation runs: the NCCL transport that ships and the
// host build of its reducer.
struct HostGpuTransportAndReducer {
  std::shared_ptr<NcclTransport> transport;
  std::shared_ptr<Reducer> reducer;  // the host build of CudaReducer
};

// One collective's worth of publication calls straight on the transport, as a one-hop plan
// makes them: ("publish", phase, bytes), ("expect", phase, [bytes per rank]),
// ("read", peer, phase, bytes) and ("end",) (the collective ends; a new one begins).
void runPublications(NcclTransport& transport, int rank, const py::list& program) {
  struct Call {
    std::string kind;
    int peer = 0, phase = 0;
    size_t bytes = 0;
    std::vector<size_t> sizes;
  };
  std::vector<Call> calls;
  for (const py::handle& item : program) {
    const py::tuple t = item.cast<py::tuple>();
    Call c{t[0].cast<std::string>()};
    if (c.kind == "publish") c.phase = t[1].cast<int>(), c.bytes = t[2].cast<size_t>();
    else if (c.kind == "expect") c.phase = t[1].cast<int>(), c.sizes = t[2].cast<std::vector<size_t>>();
    else if (c.kind == "read") c.peer = t[1].cast<int>(), c.phase = t[2].cast<int>(), c.bytes = t[3].cast<size_t>();
    else RC_CHECK(c.kind == "end", "unknown publication call '", c.kind, "'");
    calls.push_back(c);
  }
  py::gil_scoped_release unlocked;
  auto envelope = [](int owner, size_t bytes) {
    Envelope e;
    e.bytes = bytes;
    e.offset = static_cast<uint64_t>(owner);
    return e;
  };
  try {
    const CallName name{"publications"};
    transport.begin(0, name);
    for (const Call& c : calls) {
      if (c.kind == "publish") {
        transport.acquirePublish(c.phase, c.bytes);
        transport.commitPublish(c.phase, envelope(rank, c.bytes));
      } else if (c.kind == "expect") {
        transport.expectPublished(c.phase, c.sizes);
      } else if (c.kind == "read") {
        transport.acquirePublished(c.peer, c.phase, envelope(c.peer, c.bytes));
      } else {
        transport.end();
        transport.begin(0, name);
      }
    }
    transport.end();
  } catch (const Error& e) {
    transport.abort(e.what());
    throw;
  }
}

}  // namespace

void bindHostGpu(py::module_& testing) {
  auto m = testing.def_submodule("host_gpu", "CUDA and NCCL on the host, for the CPU tests");
  auto release = py::call_guard<py::gil_scoped_release>();
  using Handle = HostGpuTransportAndReducer;
  py::class_<Handle, std::shared_ptr<Handle>>(m, "TransportAndReducer")
      .def(py::init([](int rank, int worldSize, const py::bytes& uniqueId, size_t sliceBytes,
                       int slots, size_t publishBytes, double timeout, bool cudaGraphs,
                       int smsForNccl) {
             CudaTransportOptions o;
             o.rank = rank;
             o.worldSize = worldSize;
             o.uniqueId = uniqueId;
             o.slotBytes = sliceBytes;
             o.slots = slots;
             o.publishBytes = publishBytes;
             o.timeoutSeconds = timeout;
             o.recordGraphs = cudaGraphs;
             o.smsForNccl = smsForNccl;
             o.api = &hostgpu::api();
             py::gil_scoped_release unlocked;  // creation waits for every rank
             auto handle = std::make_shared<Handle>();
             handle->transport = std::make_shared<NcclTransport>(o);
             runKernelsOnHostStreams();
             handle->reducer = hostkern::makeCudaReducer(
                 o.device, handle->transport->computeStream(), o.smsForNccl);
             return handle;
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("unique_id"),
           py::arg("slice_bytes"), py::arg("slots"), py::arg("publish_bytes"), py::arg("timeout"),
           py::arg("cuda_graphs"), py::arg("nccl_sms"))
      .def_property_readonly(
          "transport", [](const Handle& h) -> std::shared_ptr<Transport> { return h.transport; })
      .def_property_readonly(
          "reducer", [](const Handle& h) -> std::shared_ptr<Reducer> { return h.reducer; })
      .def("synchronize", [](Handle& h, double timeout) { h.transport->synchronize(timeout); },
           py::arg("timeout") = 0.0, release)
      .def("query", [](Handle& h) { return h.transport->query(); }, release)
      .def("run_publications",
           [](Handle& h, int rank, const py::list& program) {
             runPublications(*h.transport, rank, program);
           },
           py::arg("rank"), py::arg("program"))
      .def("release", [](Handle& h) {
        h.reducer.reset();
        h.transport.reset();
      }, release);
  m.def("synchronize_caller", [] { hostgpu::api().cudaStreamSynchronize(nullptr); }, release,
        "Waits for the calling thread's default stream (where its collectives end)");
  m.def("new_stream", [] {
    cudaStream_t s = nullptr;
    hostgpu::api().cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return reinterpret_cast<uintptr_t>(s);
  }, "A stream (never freed: tests make a few)");
  m.def("synchronize_stream", [](uintptr_t s) {
    hostgpu::api().cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(s));
  }, release);
  m.def("begin_capture", [](uintptr_t s) { hostgpu::beginCapture(reinterpret_cast<cudaStream_t>(s)); });
  m.def("end_capture", [](uintptr_t s) { return hostgpu::endCapture(reinterpret_cast<cudaStream_t>(s)); });
  m.def("launch_graph", [](uintptr_t graph, uintptr_t s) {
    hostgpu::launchGraph(graph, reinterpret_cast<cudaStream_t>(s));
  });
  m.def("set_synchronize_failure", [](int status) {
    hostgpu::setSynchronizeFailure(static_cast<cudaError_t>(status));
  }, py::arg("status"));
  m.def("destroy_graph", &hostgpu::destroyGraph, py::arg("graph"),
        "The caller destroys a graph from end_capture (and what it instantiated from it)");
  m.def("unique_id", [] { return py::bytes(hostgpu::uniqueId()); });
  m.def("calls", &hostgpu::callCounts, "{function: calls} since reset()");
  m.def("violations", &hostgpu::violations, "misuse of CUDA or NCCL seen since reset()");
  m.def("reset", [] {
    hostgpu::reset();
    hostkern::resetGridStats();
  });
  m.def("set_jitter", &hostgpu::setJitterMicroseconds, py::arg("microseconds"));
  m.def("set_stall", &hostgpu::setStall, py::arg("rank"), py::arg("groups"));
  m.def("set_posts_in_progress", &hostgpu::setPostsInProgress, py::arg("in_progress"));
  m.def("set_device_properties", [](int sms, int residentBlocks) {
    hostkern::deviceProperties() = {sms, residentBlocks};
  }, py::arg("sms"), py::arg("resident_blocks"),
        "The SM count and resident blocks per SM the kernels' launch sizing sees");
  m.def("device_properties", [] {
    const hostkern::DeviceProperties p = hostkern::deviceProperties();
    return py::make_tuple(p.sms, p.residentBlocks);
  });
  m.def("grid_stats", [] {
    const hostkern::GridStats g = hostkern::gridStats();
    return py::dict(py::arg("launches") = g.launches, py::arg("max_blocks") = g.maxBlocks,
                    py::arg("threads_run") = g.threadsRun);
  }, "Kernel grids run on the host since reset()");
  m.def("last_error", [] { return static_cast<int>(hostgpu::peekLastError()); },
        "The calling thread's CUDA last error, without clearing it");
}

}  // namespace ringcomm
