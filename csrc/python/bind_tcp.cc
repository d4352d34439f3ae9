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
                       uint32_t connections, double timeout, const std::string& listenHost,
                       const py::bytes& secret, bool logDrops) {
             return std::make_shared<SocketTransport>(
                 rank, worldSize,
                 SocketOptions{slotBytes, slotCount, connections, timeout, logDrops}, listenHost,
                 std::string(secret));
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("connections"), py::arg("timeout"), py::arg("listen_host"), py::arg("secret"),
           py::arg("log_drops"),
           "Listens on listen_host (the IPv4 address peers reach this rank at) on a port the "
           "kernel picks; publish .address, then connect() with every rank's. secret: "
           "SECRET_BYTES bytes, the same on every rank, that admit a peer's connections; "
           "log_drops: a line on stderr for each other connection dropped")
      .def_property_readonly("address", &SocketTransport::address, "\"ip:port\" to publish")
      .def_property_readonly("dropped", &SocketTransport::dropped,
                             "Incoming connections dropped before they counted (no secret, "
                             "no hello in time, ...)")
      .def("connect", &SocketTransport::connect, py::arg("addresses"), py::arg("labels"),
           py::call_guard<py::gil_scoped_release>(),
           "Every rank's address (this rank's included) and a label per rank for errors; "
           "connections are made on the first send to a peer")
      .def("arrived_tag", &SocketTransport::arrivedTag, py::arg("peer"),
           "The tag of the next point-to-point message from peer if it has arrived, else None");
  m.attr("SECRET_BYTES") = SocketTransport::kSecretBytes;
}

}  // namespace ringcomm::python
