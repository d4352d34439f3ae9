// The pybind11 module ringcomm._C: thin. Python passes raw addresses and enum values; every
// argument check that needs no tensor knowledge happens in C++ and surfaces as an exception.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>

#include "cpu/cpu_reducer.h"
#include "cpu/shm_p2p.h"
#include "cpu/shm_transport.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/schedule.h"

#ifdef RINGCOMM_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace py = pybind11;
using namespace ringcomm;

namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

py::dict planToDict(const Plan& plan) {
  py::list chunks, steps;
  for (const Range& chunk : plan.chunks) chunks.append(py::make_tuple(chunk.offset, chunk.count));
  for (const Step& step : plan.steps) {
    py::dict row;
    row["recv_from"] = step.recvFrom;
    row["send_to"] = step.sendTo;
    row["chunk"] = step.chunk;
    row["offset"] = step.range.offset;
    row["count"] = step.range.count;
    row["reduce"] = step.reduce;
    row["store"] = step.store;
    row["finalize"] = step.finalize;
    row["ack"] = step.ack;
    steps.append(row);
  }
  py::dict result;
  result["buffer_count"] = plan.bufferCount;
  result["chunks"] = chunks;
  result["steps"] = steps;
  return result;
}

ShmOptions shmOptions(size_t slotBytes, uint32_t slotCount, double timeout, int spins,
                      int yieldMicros) {
  ShmOptions options;
  options.slotBytes = slotBytes;
  options.slotCount = slotCount;
  options.wait.timeoutSeconds = timeout;
  options.wait.spins = spins;
  options.wait.yieldMicros = yieldMicros;
  return options;
}

py::dict buildInfo() {
  py::dict info;
#ifdef RINGCOMM_WITH_CUDA
  info["cuda"] = true;
  info["cuda_archs_csv"] = RINGCOMM_CUDA_ARCHS;
  info["nccl_version"] = RINGCOMM_NCCL_HEADER_VERSION;
#else
  info["cuda"] = false;
  info["cuda_archs_csv"] = "";
  info["nccl_version"] = py::none();
#endif
  return info;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "ringcomm's C++ core: ring schedules, executor, CPU and CUDA backends";

  auto base = py::register_exception<Error>(m, "RingcommError", PyExc_RuntimeError);
  py::register_exception<TimeoutError>(m, "CommTimeoutError", base.ptr());
  py::register_exception<MismatchError>(m, "MismatchError", base.ptr());
  py::register_exception<PeerError>(m, "PeerError", base.ptr());

  py::enum_<DataType>(m, "DataType")
      .value("float32", DataType::Float32)
      .value("float64", DataType::Float64)
      .value("float16", DataType::Float16)
      .value("bfloat16", DataType::BFloat16)
      .value("int8", DataType::Int8)
      .value("uint8", DataType::UInt8)
      .value("int32", DataType::Int32)
      .value("int64", DataType::Int64)
      .value("bool", DataType::Bool);
  py::enum_<RedOp>(m, "RedOp")
      .value("sum", RedOp::Sum)
      .value("prod", RedOp::Prod)
      .value("min", RedOp::Min)
      .value("max", RedOp::Max)
      .value("avg", RedOp::Avg)
      .value("band", RedOp::BAnd)
      .value("bor", RedOp::BOr)
      .value("bxor", RedOp::BXor)
      .value("land", RedOp::LAnd)
      .value("lor", RedOp::LOr);
  py::enum_<Primitive>(m, "Primitive")
      .value("all_reduce", Primitive::AllReduce)
      .value("reduce_scatter", Primitive::ReduceScatter)
      .value("all_gather", Primitive::AllGather)
      .value("broadcast", Primitive::Broadcast)
      .value("reduce", Primitive::Reduce)
      .value("gather", Primitive::Gather)
      .value("scatter", Primitive::Scatter);

  m.def("dtype_size", &dataTypeSize);
  m.def("check_op", [](RedOp op, DataType type) {
    std::string why;
    RC_CHECK(opSupported(op, type, &why), why);
  });
  m.def("build_info", &buildInfo);
  m.def(
      "make_plan",
      [](Primitive primitive, int rank, int worldSize, size_t count, int root) {
        return planToDict(makePlan({primitive, rank, worldSize, count, root}));
      },
      py::arg("primitive"), py::arg("rank"), py::arg("world_size"), py::arg("count"),
      py::arg("root") = 0);
  m.def(
      "column_count",
      [](Primitive primitive, int worldSize, size_t count, size_t sliceElems) {
        return columnCount(makePlan({primitive, 0, worldSize, count, 0}), sliceElems);
      },
      py::arg("primitive"), py::arg("world_size"), py::arg("count"), py::arg("slice_elems"));

  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def("abort", &Transport::abort)
      .def_property_readonly("max_message_bytes", &Transport::maxMessageBytes);
  py::class_<Reducer, std::shared_ptr<Reducer>> reducer(m, "Reducer");
  reducer.def(
      "reduce",
      [](Reducer& self, uintptr_t out0, uintptr_t out1, uintptr_t a, uintptr_t b, size_t n,
         DataType type, RedOp op, int divisor, bool finalize, std::optional<DataType> wire) {
        self.reduce(address(out0), address(out1), address(a), address(b), n,
                    ReduceSpec{type, op, divisor, wire.value_or(type)}, finalize);
      },
      py::arg("out0"), py::arg("out1"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
      py::arg("wire_dtype") = py::none(),
      py::call_guard<py::gil_scoped_release>());
  py::class_<CpuReducer, Reducer, std::shared_ptr<CpuReducer>>(m, "CpuReducer").def(py::init<>());

  py::class_<ShmTransport, Transport, std::shared_ptr<ShmTransport>>(m, "ShmTransport")
      .def(py::init([](int rank, int worldSize, size_t slotBytes, uint32_t slotCount,
                       double timeout, int spins, int yieldMicros) {
             return std::make_shared<ShmTransport>(
                 rank, worldSize, shmOptions(slotBytes, slotCount, timeout, spins, yieldMicros));
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("timeout"), py::arg("spins"), py::arg("yield_micros") = 2000)
      .def_property_readonly("channel_name", &ShmTransport::channelName)
      .def("connect", &ShmTransport::connect, py::arg("names"),
           py::call_guard<py::gil_scoped_release>())
      .def("unlink_names", &ShmTransport::unlinkNames);

  py::class_<ShmPeerLinks, Transport, std::shared_ptr<ShmPeerLinks>>(m, "ShmPeerLinks")
      .def(py::init([](int rank, int worldSize, size_t slotBytes, uint32_t slotCount,
                       double timeout, int spins, int yieldMicros) {
             return std::make_shared<ShmPeerLinks>(
                 rank, worldSize, shmOptions(slotBytes, slotCount, timeout, spins, yieldMicros));
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("slot_bytes"), py::arg("slot_count"),
           py::arg("timeout"), py::arg("spins"), py::arg("yield_micros") = 2000)
      .def("create_outgoing", &ShmPeerLinks::createOutgoing, py::arg("peer"))
      .def("attach_incoming", &ShmPeerLinks::attachIncoming, py::arg("peer"), py::arg("name"))
      .def("unlink_incoming", &ShmPeerLinks::unlinkIncoming, py::arg("peer"))
      .def("has_outgoing", &ShmPeerLinks::hasOutgoing, py::arg("peer"))
      .def("has_incoming", &ShmPeerLinks::hasIncoming, py::arg("peer"));

  using Comm = Communicator;
  auto release = py::call_guard<py::gil_scoped_release>();
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Communicator")
      .def(py::init([](int rank, int worldSize, std::shared_ptr<Transport> transport,
                       std::shared_ptr<Reducer> reducer, size_t sliceBytes) {
             return std::make_shared<Comm>(rank, worldSize, std::move(transport),
                                           std::move(reducer), CommunicatorOptions{sliceBytes});
           }),
           py::arg("rank"), py::arg("world_size"), py::arg("transport"), py::arg("reducer"),
           py::arg("slice_bytes"))
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("world_size", &Comm::worldSize)
      .def_property_readonly("sequence", &Comm::sequence)
      .def_property_readonly("closed", &Comm::closed)
      .def_property_readonly("failure", &Comm::failure)
      .def_property("slice_bytes", &Comm::sliceBytes, &Comm::setSliceBytes)
      .def(
          "all_reduce",
          [](Comm& c, uintptr_t data, size_t n, DataType t, RedOp op, std::optional<DataType> wire) {
            c.allReduce(address(data), n, t, op, wire.value_or(t));
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("wire_dtype") = py::none(), release)
      .def(
          "reduce_scatter",
          [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, RedOp op) {
            c.reduceScatter(address(out), address(in), n, t, op);
          },
          release)
      .def(
          "all_gather",
          [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t) {
            c.allGather(address(out), address(in), n, t);
          },
          release)
      .def(
          "broadcast",
          [](Comm& c, uintptr_t data, size_t n, DataType t, int src) {
            c.broadcast(address(data), n, t, src);
          },
          release)
      .def(
          "reduce",
          [](Comm& c, uintptr_t data, size_t n, DataType t, RedOp op, int dst) {
            c.reduce(address(data), n, t, op, dst);
          },
          release)
      .def(
          "gather",
          [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, int dst) {
            c.gather(address(out), address(in), n, t, dst);
          },
          release)
      .def(
          "scatter",
          [](Comm& c, uintptr_t out, uintptr_t in, size_t n, DataType t, int src) {
            c.scatter(address(out), address(in), n, t, src);
          },
          release)
      .def("set_peer_links", &Comm::setPeerLinks, py::arg("links"))
      .def(
          "send",
          [](Comm& c, uintptr_t data, size_t n, DataType t, int peer, int tag) {
            c.send(address(data), n, t, peer, tag);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("tag"),
          release)
      .def(
          "recv",
          [](Comm& c, uintptr_t data, size_t n, DataType t, int peer, int tag) {
            c.recv(address(data), n, t, peer, tag);
          },
          py::arg("data"), py::arg("count"), py::arg("dtype"), py::arg("peer"), py::arg("tag"),
          release)
      .def(
          "all_to_all",
          [](Comm& c, uintptr_t out, uintptr_t in, const std::vector<size_t>& sendCounts,
             const std::vector<size_t>& recvCounts, DataType t) {
            c.allToAll(address(out), address(in), sendCounts, recvCounts, t);
          },
          py::arg("output"), py::arg("input"), py::arg("send_counts"), py::arg("recv_counts"),
          py::arg("dtype"), release)
      .def("close", &Comm::close, release);

#ifdef RINGCOMM_WITH_CUDA
  bindCuda(m);
#endif
}
