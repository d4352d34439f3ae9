// ringcomm._C's transports and reducers: the base classes Communicator takes, and the CPU ones
// (shared-memory ring transport, point-to-point links, CPU reducer), and the transport that
// reaches each peer through its own. The CUDA ones are in python/cuda/bind_cuda.cc.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>

#include "cpu/cpu_reducer.h"
#include "python/bindings.h"
#include "ringcomm/reducer.h"
#include "ringcomm/routed_transport.h"
#include "ringcomm/transport.h"
#include "shm/shm_p2p.h"
#include "shm/shm_transport.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

ShmOptions shmOptions(size_t slotBytes, uint32_t slotCount, double timeout, int spinMicros,
                      int yieldMicros, size_t publishBytes) {
  ShmOptions options;
  options.slotBytes = slotBytes;
  options.slotCount = slotCount;
  options.publishBytes = publishBytes;
  options.wait.timeoutSeconds = timeout;
  options.wait.spinMicros = spinMicros;
  options.wait.yieldMicros = yieldMicros;
  return options;
}

void bindShmTransport(py::module_& m) {
  py::class_<ShmTransport, Transport, std::shared_ptr<ShmTransport>>(m, "ShmTransport")
      .def(py::init([](int rank, int worldSize, size_t slotBytes, uint32_t slotCount,
                       double timeout, int spinMicros, int yieldMicros, size_t publishBytes) {
             return std::make_shared<ShmTransport>(
                 rank, worldSize,
                 shmOptions(slotBytes, slotCount, timeout, spinMicros, yieldMicros, publishBytes));
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("timeout"), py::arg("spin_us"), py::arg("yield_us"), py::arg("publish_bytes"))
      .def_property_readonly("channel_name", &ShmTransport::channelName)
      .def("connect", &ShmTransport::connect, py::arg("names"),
           py::call_guard<py::gil_scoped_release>())
      .def("unlink_names", &ShmTransport::unlinkNames);
}

void bindShmPeerLinks(py::module_& m) {
  py::class_<ShmPeerLinks, Transport, std::shared_ptr<ShmPeerLinks>>(m, "ShmPeerLinks")
      .def(py::init([](int rank, int worldSize, size_t slotBytes, uint32_t slotCount,
                       double timeout, int spinMicros, int yieldMicros) {
             return std::make_shared<ShmPeerLinks>(
                 rank, worldSize,
                 shmOptions(slotBytes, slotCount, timeout, spinMicros, yieldMicros, 0));  // no boards
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("timeout"), py::arg("spin_us"), py::arg("yield_us"))
      .def("create_outgoing", &ShmPeerLinks::createOutgoing, py::arg("peer"))
      .def("attach_incoming", &ShmPeerLinks::attachIncoming, py::arg("peer"), py::arg("name"))
      .def("unlink_incoming", &ShmPeerLinks::unlinkIncoming, py::arg("peer"))
      .def("has_outgoing", &ShmPeerLinks::hasOutgoing, py::arg("peer"))
      .def("has_incoming", &ShmPeerLinks::hasIncoming, py::arg("peer"))
      .def("arrived_tag", &ShmPeerLinks::arrivedTag, py::arg("peer"));
}

}  // namespace

void bindTransports(py::module_& m) {
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def("abort", &Transport::abort);
  py::class_<Reducer, std::shared_ptr<Reducer>>(m, "Reducer");
  py::class_<CpuReducer, Reducer, std::shared_ptr<CpuReducer>>(m, "CpuReducer").def(py::init<>());
  bindShmTransport(m);
  bindShmPeerLinks(m);
  py::class_<RoutedTransport, Transport, std::shared_ptr<RoutedTransport>>(m, "RoutedTransport")
      .def(py::init<int, std::vector<std::shared_ptr<Transport>>>(), py::arg("rank"),
           py::arg("by_peer"));
}

}  // namespace ringcomm::python
