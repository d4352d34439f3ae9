// ringcomm._C.Communicator: the one communicator binding, CPU and CUDA alike. Every collective is
// a CollectiveRequest for run() (its `stream`: the caller's cudaStream_t as an integer; ignored
// on the CPU); point-to-point calls; what the transports moved (traffic).
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.h"
#include "ringcomm/communicator.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

using Comm = Communicator;
using ClassOfComm = py::class_<Comm, std::shared_ptr<Comm>>;

py::dict trafficToDict(const Comm& c) {
  const TrafficStats t = c.traffic();
  py::dict d;
  d["bytes_sent"] = t.bytesSent;
  d["bytes_received"] = t.bytesReceived;
  d["messages_sent"] = t.messagesSent;
  d["messages_received"] = t.messagesReceived;
  d["bytes_published"] = t.bytesPublished;
  d["publications"] = t.publications;
  d["waits"] = t.waits;
  d["waits_ended_spinning"] = t.waitsEndedSpinning;
  d["waits_ended_yielding"] = t.waitsEndedYielding;
  d["waits_ended_sleeping"] = t.waitsEndedSleeping;
  d["wait_seconds"] = t.waitSeconds;
  d["sleeping_wait_seconds"] = t.sleepingWaitSeconds;
  d["collectives"] = c.sequence();
  return d;
}

void bindCollectives(ClassOfComm& comm) {
  auto release = py::call_guard<py::gil_scoped_release>();
  // The request's fields positionally first: the hot path's form, which skips building a
  // request object (about 0.5 us) and pybind's keyword matching (about 0.7 us).
  comm.def(
          "run",
          [](Comm& c, Collective collective, uintptr_t output, uintptr_t input, size_t count,
             DataType type, RedOp op, int root, Algorithm algorithm,
             std::optional<DataType> wireType, uintptr_t stream) {
            c.run(CollectiveRequest{collective, address(output), address(input), count, type, op,
                                    root, algorithm, wireType, stream});
          },
          release)
      .def("run", &Comm::run, py::arg("request"), release,
           "Runs one collective, on the caller's thread or (device transports) stream: a "
           "CollectiveRequest, or its fields positionally (collective, output, input, count, "
           "dtype, op, root, algorithm, wire_dtype, stream)")
      .def("in_place_entry", &inPlaceEntry, py::arg("collective"), py::arg("algorithm"),
           py::arg("owner"), py::arg("fallback"), py::arg("gate"), py::arg("queue"),
           py::arg("on_worker"), py::arg("observers"), py::arg("tensor_type"),
           py::arg("tensor_dtypes"),
           "Communicator.all_reduce's or broadcast's entry on this ring: runs a call that asks "
           "nothing more at once, hands any other to `fallback` (in_place_entry.cc)")
      .def(
          "time_runs",
          [](Comm& c, const CollectiveRequest& request, int calls) {
            // The core's own floor: back-to-back runs with no Python between them (the bench's
            // "core" layer). Nanoseconds per call, in call order: one clock read per call, each
            // call's time from the previous one's end, so that they add up to the loop's.
            std::vector<double> nanos(calls > 0 ? calls : 0);
            auto last = std::chrono::steady_clock::now();
            for (double& n : nanos) {
              c.run(request);
              const auto now = std::chrono::steady_clock::now();
              n = std::chrono::duration<double, std::nano>(now - last).count();
              last = now;
            }
            return nanos;
          },
          py::arg("request"), py::arg("calls"), release,
          "Runs `request` `calls` times back to back and returns each call's time (ns): what "
          "a call costs in the core, without Python")
      .def("resolve_algorithm", &Comm::resolveAlgorithm, py::arg("algorithm"),
           py::arg("collective"), py::arg("bytes"),
           "The algorithm a collective of `bytes` runs with when `algorithm` is asked for");
}

void bindPointToPoint(ClassOfComm& comm) {
  auto release = py::call_guard<py::gil_scoped_release>();
  comm.def("set_peer_links", &Comm::setPeerLinks, py::arg("links"))
      .def("set_trace_buffer", &Comm::setTraceBuffer, py::arg("calls"))
      .def("flight_record", [](const Comm& c, std::optional<size_t> newest) {
             py::list out;
             auto orNone = [](const std::string& s) -> py::object {
               if (s.empty()) return py::none();
               return py::str(s);
             };
             for (const CallRecord& r : c.flightRecord(newest.value_or(SIZE_MAX))) {
               py::dict d;
               d["call"] = r.id, d["name"] = r.name;
               d["sequence"] = r.numbered ? py::cast(r.sequence) : py::none();
               d["dtype"] = orNone(r.dtype), d["count"] = r.count, d["op"] = orNone(r.op);
               d["algorithm"] = orNone(r.algorithm);
               d["peer"] = r.peer >= 0 ? py::cast(r.peer) : py::none();
               d["state"] = callStateName(r.state);
               d["step"] = r.step, d["steps"] = r.steps;
               d["started"] = r.started, d["ended"] = r.ended, d["failure"] = r.failure;
               out.append(d);
             }
             return out;
           }, py::arg("newest") = py::none(),
           "The last calls, oldest first (set_trace_buffer keeps how many; at most `newest`)")
      .def("set_failure_hook", &Comm::setFailureHook, py::arg("hook"),
           "hook() runs on the failing thread once a call has failed and is recorded")
      .def("set_levels", &Comm::setLevels, py::arg("local"), py::arg("cross"),
           py::arg("host_ranks"), py::arg("uneven_leaders") = py::none(),
           "uneven_leaders: None (by the bytes between hosts), True or False (see two_level_uneven.cc)")
      .def(
          "send",
          [](Comm& c, uintptr_t data, size_t n, DataType t, int peer, int tag, uintptr_t stream) {
            c.send(address(data), n, t, peer, tag, stream);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("tag"),
          py::arg("stream") = 0, release)
      .def(
          "recv",
          [](Comm& c, uintptr_t data, size_t n, DataType t, int peer, int tag, uintptr_t stream) {
            c.recv(address(data), n, t, peer, tag, stream);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("tag"),
          py::arg("stream") = 0, release)
      .def(
          "send_recv_batch",
          [](Comm& c,
             const std::vector<std::tuple<bool, uintptr_t, size_t, DataType, int, int>>& ops,
             uintptr_t stream) {
            std::vector<PointToPointOp> batch;
            batch.reserve(ops.size());
            for (const auto& [send, data, n, t, peer, tag] : ops)
              batch.push_back(PointToPointOp{send, address(data), n, t, peer, tag});
            c.sendRecvBatch(batch, stream);
          },
          py::arg("ops"), py::arg("stream") = 0, release,
          "Sends and receives as one unit (one NCCL group): ops are (is_send, address, count, "
          "dtype, peer, tag) tuples")
      .def(
          "all_to_all",
          [](Comm& c, uintptr_t out, uintptr_t in, const std::vector<size_t>& sendCounts,
             const std::vector<size_t>& recvCounts, DataType t, uintptr_t stream) {
            c.allToAll(address(out), address(in), sendCounts, recvCounts, t, stream);
          },
          py::arg("output"), py::arg("input"), py::arg("send_counts"), py::arg("recv_counts"),
          py::arg("dtype"), py::arg("stream") = 0, release);
}

}  // namespace

void bindCommunicator(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  ClassOfComm comm(m, "Communicator");
  comm.def(py::init([](int rank, int worldSize, std::shared_ptr<Transport> transport,
                       std::shared_ptr<Reducer> reducer, size_t sliceBytes,
                       const std::map<std::string, size_t>& thresholds) {
             CommunicatorOptions options{sliceBytes, thresholdsFrom(thresholds)};
             return std::make_shared<Comm>(rank, worldSize, std::move(transport),
                                           std::move(reducer), options);
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("transport"), py::arg("reducer"),
           py::arg("slice_bytes"), py::arg("thresholds") = std::map<std::string, size_t>{})
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::worldSize)
      .def_property_readonly("failure", &Comm::failure)
      .def_property("slice_bytes", &Comm::sliceBytes, &Comm::setSliceBytes);
  bindCollectives(comm);
  bindPointToPoint(comm);
  comm.def("traffic", &trafficToDict,
           "What the transports moved and how long they waited (see Communicator.stats)")
      .def("reset_traffic", &Comm::resetTraffic)
      .def("abort", &Comm::abort, py::arg("why"), release,
           "Fails this communicator's waits on any thread and every peer's (a PeerError "
           "naming this rank and `why`); callable while another thread runs a collective")
      .def("close", &Comm::close, release);
}

}  // namespace ringcomm::python
