// ringcomm._C.SocketTransport: the TCP transport, for ranks on different hosts. A Transport like
// the shared-memory ones: a Communicator's ring transport, or its point-to-point links.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "python/bindings.h"
#include "tcp/socket_transport.h"

namespace py = pybind11;

namespace ringcomm::python {

void bindTcp(py::module_& m) {
  py::class_<SocketTransport, Transport, std::shared_ptr<SocketTransport>>(m, "SocketTransport")
      .def(py::init([](int rank, int worldSize, size_t slotBytes, uint32_t slotCount,
                       uint32_t connections, double timeout, const std::string& listenHost) {
             return std::make_shared<SocketTransport>(
                 rank, worldSize, SocketOptions{slotBytes, slotCount, connections, timeout},
                 listenHost);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("connections"), py::arg("timeout"), py::arg("listen_host"),
           "Listens on listen_host (the IPv4 address peers reach this rank at) on a port the "
           "kernel picks; publish .address, then connect() with every rank's")
      .def_property_readonly("address", &SocketTransport::address, "\"ip:port\" to publish")
      .def("connect", &SocketTransport::connect, py::arg("addresses"), py::arg("labels"),
           py::call_guard<py::gil_scoped_release>(),
           "Every rank's address (this rank's included) and a label per rank for errors; "
           "connections are made on the first send to a peer")
      .def("arrived_tag", &SocketTransport::arrivedTag, py::arg("peer"),
           "The tag of the next point-to-point message from peer if it has arrived, else None");
}

}  // namespace ringcomm::python
