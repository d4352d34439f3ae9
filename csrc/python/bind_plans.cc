// ringcomm._C's schedule queries: the plan a collective runs (make_plan) and what
// algorithm=auto picks (choose_algorithm).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>

#include "python/bindings.h"
#include "ringcomm/algorithms.h"
#include "ringcomm/schedule.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

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

}  // namespace

void bindPlans(py::module_& m) {
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
}

}  // namespace ringcomm::python
