// The pybind11 module ringcomm._C: thin. Python passes raw addresses and enum values; every
// argument check that needs no tensor knowledge happens in C++ and surfaces as an exception.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

#include "cpu/cpu_reducer.h"
#include "cpu/shm_p2p.h"
#include "cpu/shm_transport.h"
#include "python/signal_check.h"
#include "ringcomm/algorithms.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/schedule.h"

#ifdef RINGCOMM_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace py = pybind11;
using namespace ringcomm;

namespace ringcomm {
void bindTesting(py::module_& m);  // testing/bindings_testing.cc: ringcomm._C.testing
}

namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

py::dict planToDict(const Plan& plan) {
  py::list chunks, steps;
  for (const Range& chunk : plan.chunks) chunks.append(py::make_tuple(chunk.offset, chunk.count));
  for (const Step& step : plan.steps) {
    py::dict row;
    row["kind"] = stepKindName(step.kind);
    row["recv_from"] = step.recvFrom;
    row["send_to"] = step.sendTo;
    row["read_from"] = step.readFrom;
    row["read_phase"] = step.readPhase;
    row["published_chunk"] = step.publishedChunk;
    row["publish_phase"] = step.publishPhase;
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

// CommOptions' field for an algorithm's auto threshold: "<name>_max_bytes".
std::string thresholdName(const AlgorithmInfo& row) { return std::string(row.name) + "_max_bytes"; }

// Thresholds by their CommOptions names; the ones not given keep kAlgorithms' defaults.
AlgorithmThresholds thresholdsFrom(const std::map<std::string, size_t>& given) {
  AlgorithmThresholds thresholds;
  std::map<std::string, size_t> unknown = given;
  std::string known;
  for (const AlgorithmInfo& row : kAlgorithms) {
    if (!row.autoMaxBytes) continue;
    const std::string name = thresholdName(row);
    known += (known.empty() ? "" : ", ") + name;
    if (auto it = given.find(name); it != given.end()) thresholds.set(row.algorithm, it->second);
    unknown.erase(name);
  }
  RC_CHECK(unknown.empty(), "unknown threshold '", unknown.begin()->first,
           "'; the algorithms' are ", known);
  return thresholds;
}

// ringcomm._C.CollectiveRequest: Communicator::run's argument, with keywords (`dtype`,
// `wire_dtype` as in Python) and raw addresses as integers. Positional order is the fields'.
void bindCollectiveRequest(py::module_& m) {
  using R = CollectiveRequest;
  py::class_<R>(m, "CollectiveRequest",
                "One collective call for Communicator.run: which collective, its buffers (raw "
                "addresses), count (elements of the in-place tensor, else of this rank's block), "
                "dtype, op, root, algorithm, wire dtype and stream")
      .def(py::init([](Collective collective, uintptr_t output, uintptr_t input, size_t count,
                       DataType type, RedOp op, int root, Algorithm algorithm,
                       std::optional<DataType> wireType, uintptr_t stream) {
             return R{collective, address(output), address(input), count, type, op, root,
                      algorithm, wireType, stream};
           }),
           py::arg("collective"), py::arg("output") = 0, py::arg("input") = 0,
           py::arg("count") = 0, py::arg("dtype") = DataType::Float32,
           py::arg("op") = RedOp::Sum, py::arg("root") = 0,
           py::arg("algorithm") = Algorithm::Ring, py::arg("wire_dtype") = py::none(),
           py::arg("stream") = 0)
      .def_readwrite("collective", &R::collective)
      .def_property(
          "output", [](const R& r) { return reinterpret_cast<uintptr_t>(r.output); },
          [](R& r, uintptr_t value) { r.output = address(value); })
      .def_property(
          "input", [](const R& r) { return reinterpret_cast<uintptr_t>(r.input); },
          [](R& r, uintptr_t value) { r.input = address(value); })
      .def_readwrite("count", &R::count)
      .def_readwrite("dtype", &R::type)
      .def_readwrite("op", &R::op)
      .def_readwrite("root", &R::root)
      .def_readwrite("algorithm", &R::algorithm)
      .def_readwrite("wire_dtype", &R::wireType)
      .def_readwrite("stream", &R::stream)
      .def("__repr__", [](const R& r) {
        std::ostringstream out;
        out << "CollectiveRequest(" << collectiveName(r.collective) << ", output=" << r.output
            << ", input=" << r.input << ", count=" << r.count << ", dtype="
            << dataTypeName(r.type) << ", op=" << redOpName(r.op) << ", root=" << r.root
            << ", algorithm=" << algorithmName(r.algorithm) << ", wire_dtype="
            << (r.wireType ? dataTypeName(*r.wireType) : "None") << ", stream=" << r.stream
            << ")";
        return out.str();
      });
}

const char* layoutName(Layout layout) {
  switch (layout) {
    case Layout::InPlace: return "in_place";
    case Layout::OutputBlock: return "output_block";
    case Layout::InputBlock: return "input_block";
    case Layout::PerPeer: return "per_peer";
  }
  return "unknown";
}

py::dict buildInfo() {
  py::dict info;
#ifdef RINGCOMM_WITH_CUDA
  info["cuda"] = true;
  info["cuda_archs_csv"] = RINGCOMM_CUDA_ARCHS;
  info["nccl_version"] = RINGCOMM_NCCL_HEADER_VERSION;
  info["cuda_include"] = RINGCOMM_CUDA_INCLUDE;  // the toolkit's headers it was built with
#else
  info["cuda"] = false;
  info["cuda_archs_csv"] = "";
  info["nccl_version"] = py::none();
  info["cuda_include"] = py::none();
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
  // A wait ended by a signal's handler (Ctrl-C): Python gets what the handler raised
  // (KeyboardInterrupt, SystemExit), noted with where the wait was. Registered after the
  // translators above, so it is tried first.
  python::installSignalCheck();
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      std::rethrow_exception(thrown);
    } catch (const InterruptedError& e) {
      const std::string what = std::string("ringcomm: ") + e.what();
      if (!python::restoreHandlerException(what.c_str()))
        PyErr_SetString(PyExc_KeyboardInterrupt, what.c_str());
    }
  });

  // The enums from the tables in types.h: a new value there needs nothing here.
  py::enum_<DataType> dataTypes(m, "DataType");
  for (const DataTypeInfo& row : kDataTypes) dataTypes.value(row.name, row.type);
  py::enum_<RedOp> redOps(m, "RedOp");
  for (const RedOpInfo& row : kRedOps) redOps.value(row.name, row.op);
  py::enum_<Collective> collectiveEnum(m, "Collective");
  for (const CollectiveInfo& row : kCollectives) collectiveEnum.value(row.name, row.collective);
  py::enum_<Algorithm> algorithms(m, "Algorithm");
  py::dict algorithmCollectives;  // name -> the collectives it plans (auto: accepts)
  for (const AlgorithmInfo& row : kAlgorithms) {
    algorithms.value(row.name, row.algorithm);
    py::list plans;
    for (const CollectiveInfo& collective : kCollectives)
      if (algorithmPlans(row.algorithm, collective.collective)) plans.append(collective.name);
    algorithmCollectives[row.name] = plans;
  }
  m.attr("ALGORITHM_COLLECTIVES") = algorithmCollectives;
  py::dict thresholds, uses;  // CommOptions' threshold fields: defaults and what they govern
  for (const AlgorithmInfo& row : kAlgorithms) {
    if (!row.autoMaxBytes) continue;
    thresholds[thresholdName(row).c_str()] = *row.autoMaxBytes;
    uses[thresholdName(row).c_str()] = row.autoUse;
  }
  m.attr("DEFAULT_THRESHOLDS") = thresholds;
  m.attr("THRESHOLD_USES") = uses;
  py::list planned;  // the collectives the schedule covers, in enum order
  py::dict collectives;  // their kCollectives columns, which the Python layer and tests read
  for (const CollectiveInfo& row : kCollectives) {
    if (!row.planned) continue;
    planned.append(row.collective);
    py::dict info;
    info["reduces"] = row.reduces;
    info["root"] = row.root != nullptr ? py::object(py::str(row.root)) : py::object(py::none());
    info["layout"] = layoutName(row.layout);
    info["wire"] = row.wire;
    collectives[row.name] = info;
  }
  m.attr("PLANNED_COLLECTIVES") = planned;
  m.attr("COLLECTIVES") = collectives;

  m.def("dtype_size", &dataTypeSize);
  m.def(
      "op_supported", [](RedOp op, DataType type) { return opSupported(op, type); },
      py::arg("op"), py::arg("dtype"), "Whether op is defined for dtype (the table in types.h).");
  bindCollectiveRequest(m);
  // The debug-mode descriptor: the header fields of the C++ Envelope a request's messages
  // carry (the algorithm as asked for), as integers to exchange.
  m.def(
      "collective_header",
      [](const CollectiveRequest& r) {
        const Envelope e = collectiveHeader(r.collective, r.count, r.type, r.op, r.root,
                                            r.wireType.value_or(r.type), r.algorithm);
        return std::vector<int64_t>{e.collective, e.dataType, e.op, e.root, e.wireType,
                                    static_cast<int64_t>(e.count), e.algorithm};
      },
      py::arg("request"));
  m.def(
      "describe_collective",
      [](const std::vector<int64_t>& h) {
        RC_CHECK(h.size() == 7, "a collective header has 7 fields, not ", h.size());
        Envelope e = collectiveHeader(static_cast<Collective>(h[0]), static_cast<uint64_t>(h[5]),
                                      static_cast<DataType>(h[1]), static_cast<RedOp>(h[2]),
                                      static_cast<int>(h[3]), static_cast<DataType>(h[4]),
                                      static_cast<Algorithm>(h[6]));
        return describeCollective(e);
      },
      py::arg("header"));
  m.def("build_info", &buildInfo);
  m.def(
      "make_plan",
      [](Collective collective, int rank, int worldSize, size_t count, int root,
         std::optional<DataType> type, std::optional<DataType> wire, Algorithm algorithm) {
        // With a dtype, the plan the communicator runs (chunks aligned for that dtype);
        // without, the unaligned split.
        size_t align = type ? chunkAlignment(*type, wire.value_or(*type)) : 1;
        return planToDict(makePlan({collective, rank, worldSize, count, root, align, algorithm}));
      },
      py::arg("collective"), py::arg("rank"), py::arg("world_size"), py::arg("count"),
      py::arg("root") = 0, py::arg("dtype") = py::none(), py::arg("wire_dtype") = py::none(),
      py::arg("algorithm") = Algorithm::Ring);
  m.def(
      "choose_algorithm",
      [](Collective collective, size_t bytes, int worldSize,
         const std::map<std::string, size_t>& thresholds, bool publications) {
        return chooseAlgorithm(collective, bytes, worldSize, publications,
                               thresholdsFrom(thresholds));
      },
      py::arg("collective"), py::arg("bytes"), py::arg("world_size"),
      py::arg("thresholds") = std::map<std::string, size_t>{}, py::arg("publications") = true,
      "What algorithm=auto runs (the communicator's own rule); thresholds by name "
      "(DEFAULT_THRESHOLDS' keys; the ones not given keep their defaults)");
  py::class_<Transport, std::shared_ptr<Transport>>(m, "Transport")
      .def("abort", &Transport::abort);
  py::class_<Reducer, std::shared_ptr<Reducer>>(m, "Reducer");
  py::class_<CpuReducer, Reducer, std::shared_ptr<CpuReducer>>(m, "CpuReducer").def(py::init<>());

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


  // The one communicator binding, CPU and CUDA alike: every collective is a CollectiveRequest
  // for run() (its `stream`: the caller's cudaStream_t as an integer; ignored on the CPU).
  using Comm = Communicator;
  auto release = py::call_guard<py::gil_scoped_release>();
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Communicator")
      .def(py::init([](int rank, int worldSize, std::shared_ptr<Transport> transport,
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
      .def_property("slice_bytes", &Comm::sliceBytes, &Comm::setSliceBytes)
      // The request's fields positionally first: the hot path's form, which skips building a
      // request object (about 0.5 us) and pybind's keyword matching (about 0.7 us).
      .def(
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
      .def("resolve_algorithm", &Comm::resolveAlgorithm, py::arg("algorithm"),
           py::arg("collective"), py::arg("bytes"),
           "The algorithm a collective of `bytes` runs with when `algorithm` is asked for")
      .def("set_peer_links", &Comm::setPeerLinks, py::arg("links"))
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
          py::arg("dtype"), py::arg("stream") = 0, release)
      .def(
          "traffic",
          [](const Comm& c) {
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
          },
          "What the transports moved and how long they waited (see Communicator.stats)")
      .def("reset_traffic", &Comm::resetTraffic)
      .def("abort", &Comm::abort, py::arg("why"), release,
           "Fails this communicator's waits on any thread and every peer's (a PeerError "
           "naming this rank and `why`); callable while another thread runs a collective")
      .def("close", &Comm::close, release);

  bindTesting(m);  // before bindCuda, which adds to m.testing
#ifdef RINGCOMM_WITH_CUDA
  bindCuda(m);
#endif
}
