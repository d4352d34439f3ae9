// ringcomm._C.testing: entry points that only tests and benchmarks call, kept out of the
// package's surface (NCCL group traces without a GPU, plan geometry, the CPU reducer).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_reducer.h"
#include "cpu/shm_wait.h"
#include "testing/group_trace.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/schedule.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

// Traced NCCL groups as lists of (kind, peer, bytes, message number, staged).
py::list groupsToList(const std::vector<std::vector<TracedOp>>& groups) {
  py::list result;
  for (const auto& group : groups) {
    py::list ops;
    for (const TracedOp& op : group)
      ops.append(py::make_tuple(op.send ? "send" : "recv", op.peer, op.bytes, op.message,
                                op.staged));
    result.append(ops);
  }
  return result;
}

// One rank's groups for a program of ("send", peer, count), ("recv", peer, count) and
// ("all_to_all", send_counts, recv_counts), run by the real Communicator over peer links that
// trace instead of calling NCCL. Buffers are fake addresses: nothing is read or written.
py::list traceP2p(int rank, int worldSize, const py::list& program, DataType type, int slots,
                  size_t slotBytes) {
  auto trace = std::make_shared<GroupTrace>(slots, slotBytes);
  Communicator comm(rank, worldSize, trace, trace);
  comm.setPeerLinks(trace);
  void* in = address(uintptr_t{1} << 40);
  void* out = address(uintptr_t{2} << 40);
  for (const py::handle& item : program) {
    const py::tuple call = item.cast<py::tuple>();
    const std::string kind = call[0].cast<std::string>();
    if (kind == "send")
      comm.send(in, call[2].cast<size_t>(), type, call[1].cast<int>(), 0);
    else if (kind == "recv")
      comm.recv(out, call[2].cast<size_t>(), type, call[1].cast<int>(), 0);
    else if (kind == "all_to_all")
      comm.allToAll(out, in, call[1].cast<std::vector<size_t>>(),
                    call[2].cast<std::vector<size_t>>(), type);
    else
      RC_THROW("unknown point-to-point call '", kind, "'");
  }
  return groupsToList(trace->groups);
}

// A GroupTrace's events: ("group", [(kind, peer, bytes, message, staged, area)]),
// ("write", area, round, phase, bytes) and ("read", area, peer, round, phase, bytes).
py::list eventsToList(const GroupTrace& trace) {
  py::list events;
  for (const TracedEvent& e : trace.events) {
    if (e.kind == TracedEvent::Group) {
      py::list ops;
      for (const TracedOp& op : trace.groups[e.group])
        ops.append(py::make_tuple(op.send ? "send" : "recv", op.peer, op.bytes, op.message,
                                  op.staged, op.area));
      events.append(py::make_tuple("group", ops));
    } else if (e.kind == TracedEvent::Write) {
      events.append(py::make_tuple("write", e.area, e.round, e.phase, e.bytes));
    } else {
      events.append(py::make_tuple("read", e.area, e.peer, e.round, e.phase, e.bytes));
    }
  }
  return events;
}

// One rank's NCCL groups and publication events for a program of ("publish", phase, bytes),
// ("expect", phase, [bytes per rank]), ("read", peer, phase, bytes), ("send"|"recv", peer,
// bytes) (ring messages through slots) and ("end",) (a collective ends), as NcclTransport
// issues them (publications.h). Envelopes name the round and the publishing rank. Returns
// (events as eventsToList, staging bytes).
py::tuple tracePublications(int rank, int worldSize, const py::list& program, int slots,
                            size_t slotBytes, size_t publishBytes) {
  GroupTrace trace(slots, slotBytes, rank, worldSize, publishBytes);
  uint64_t round = 0;
  auto envelope = [&](int owner, size_t bytes) {
    Envelope e;
    e.sequence = round;
    e.bytes = bytes;
    e.offset = static_cast<uint64_t>(owner);
    return e;
  };
  for (const py::handle& item : program) {
    const py::tuple call = item.cast<py::tuple>();
    const std::string kind = call[0].cast<std::string>();
    if (kind == "publish") {
      const int phase = call[1].cast<int>();
      const size_t bytes = call[2].cast<size_t>();
      if (phase == 0) round = trace.rounds();  // the round this publication starts
      trace.acquirePublish(phase, bytes);
      trace.commitPublish(phase, envelope(rank, bytes));
    } else if (kind == "expect") {
      trace.expectPublished(call[1].cast<int>(), call[2].cast<std::vector<size_t>>());
    } else if (kind == "read") {
      trace.acquirePublished(call[1].cast<int>(), call[2].cast<int>(),
                             envelope(call[1].cast<int>(), call[3].cast<size_t>()));
    } else if (kind == "send") {
      const Envelope e = envelope(rank, call[2].cast<size_t>());
      trace.acquireSend(call[1].cast<int>(), e.bytes);
      trace.commitSend(call[1].cast<int>(), e);
    } else if (kind == "recv") {
      trace.acquireRecv(call[1].cast<int>(), envelope(rank, call[2].cast<size_t>()));
      trace.releaseRecv(call[1].cast<int>());
    } else if (kind == "end") {
      trace.end();
    } else {
      RC_THROW("unknown publication call '", kind, "'");
    }
  }
  trace.end();
  return py::make_tuple(eventsToList(trace), trace.stagingBytes());
}

// One rank's events for one collective from the real plan and executor (one-hop algorithms
// publish), as tracePublications returns them.
py::list tracePlan(Primitive primitive, int rank, int worldSize, size_t count,
                   Algorithm algorithm, DataType type, int slots, size_t slotBytes,
                   size_t publishBytes) {
  GroupTrace trace(slots, slotBytes, rank, worldSize, publishBytes);
  PlanRequest request{primitive, rank, worldSize, count, 0, chunkAlignment(type, type),
                      algorithm};
  runTrace(trace, request, type, slotBytes);
  return eventsToList(trace);
}

}  // namespace

void bindTesting(py::module_& m) {
  py::module_ testing = m.def_submodule("testing", "entry points for tests only");
  testing.def(
      "trace_nccl_groups",
      [](Primitive primitive, int rank, int worldSize, size_t count, int root, DataType type,
         int slots, size_t slotBytes) {
        PlanRequest request{primitive, rank, worldSize, count, root, chunkAlignment(type, type)};
        return groupsToList(traceGroups(request, type, slots, slotBytes));
      },
      py::arg("primitive"), py::arg("rank"), py::arg("world_size"), py::arg("count"),
      py::arg("root"), py::arg("dtype"), py::arg("slots"), py::arg("slot_bytes"),
      "The NCCL groups (lists of (kind, peer, bytes, message number, staged)) NcclTransport "
      "issues on "
      "`rank` for one collective, from the real plan and executor, without a GPU");
  testing.def("trace_nccl_p2p", &traceP2p, py::arg("rank"), py::arg("world_size"),
              py::arg("program"), py::arg("dtype"), py::arg("slots"), py::arg("slot_bytes"),
              "The NCCL groups NcclTransport issues on `rank` for a program of send, recv and "
              "all_to_all calls (see traceP2p), without a GPU");
  testing.def("trace_nccl_publications", &tracePublications, py::arg("rank"),
              py::arg("world_size"), py::arg("program"), py::arg("slots"), py::arg("slot_bytes"),
              py::arg("publish_bytes"),
              "NcclTransport's publication exchange on `rank` for a program of publish, read, "
              "send, recv and end calls (see tracePublications), without a GPU");
  testing.def("trace_nccl_plan", &tracePlan, py::arg("primitive"), py::arg("rank"),
              py::arg("world_size"), py::arg("count"), py::arg("algorithm"), py::arg("dtype"),
              py::arg("slots"), py::arg("slot_bytes"), py::arg("publish_bytes"),
              "NcclTransport's groups and publication events on `rank` for one collective "
              "(any algorithm), from the real plan and executor, without a GPU");

  testing.def(
      "column_count",
      [](Primitive primitive, int worldSize, size_t count, size_t sliceElems) {
        return columnCount(makePlan({primitive, 0, worldSize, count, 0}), sliceElems);
      },
      py::arg("primitive"), py::arg("world_size"), py::arg("count"), py::arg("slice_elems"));
  testing.def(
      "cpu_reduce",
      [](uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n, DataType type,
         RedOp op, int divisor, bool finalize, std::optional<DataType> wire) {
        CpuReducer().reduce(address(out0), address(out1), address(a), address(b), n,
                            ReduceSpec{type, op, divisor, wire.value_or(type)}, finalize);
      },
      py::arg("out0"), py::arg("out1"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
      py::arg("wire_dtype") = py::none(), py::call_guard<py::gil_scoped_release>());

  // The process's yield gate (shm_wait.h), driven with made-up yield durations.
  testing.def(
      "note_yield",
      [](double micros) {
        return noteYield(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::micro>(micros)));
      },
      py::arg("micros"));
  testing.def("yields_are_slow", &yieldsAreSlow);
  testing.def("reset_yield_gate", &resetYieldGate);
}

}  // namespace ringcomm
