// ringcomm._C.testing: entry points that only tests and benchmarks call, kept out of the
// package's surface (plan geometry, the CPU reducer, the yield gate; host_gpu with CUDA).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_reducer.h"
#include "cpu/shm_segment.h"
#include "cpu/shm_wait.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/schedule.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

}  // namespace

void bindTesting(py::module_& m) {
  py::module_ testing = m.def_submodule("testing", "entry points for tests only");
  testing.def(
      "column_count",
      [](Collective collective, int worldSize, size_t count, size_t sliceElems) {
        return columnCount(makePlan({collective, 0, worldSize, count, 0}), sliceElems);
      },
      py::arg("collective"), py::arg("world_size"), py::arg("count"), py::arg("slice_elems"));
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
  testing.def("remove_stale_segments", &ShmSegment::removeStale, py::arg("folder") = "/dev/shm",
              py::arg("min_age_seconds") = 60.0);
  testing.def("reset_yield_gate", &resetYieldGate);
}

}  // namespace ringcomm
