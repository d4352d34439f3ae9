// ringcomm._testing: entry points that only tests and benchmarks call, a module of its own so
// that ringcomm._C holds none (plan geometry, the CPU reducer, the yield gate, a core-to-core
// round trip; with CUDA the kernels, a ring's publications and host_gpu). It links the same
// objects of the C++ core as _C and imports _C first, so the classes and enums _C registers
// (DataType, Transport, Reducer, CudaTransportAndReducer, ...) are the ones its functions take
// and return; what the core keeps in process-wide variables (the yield gate, the interrupt
// check) this module has a copy of (docs/contributing.md, "The testing module").
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/cpu_reducer.h"
#include "python/signal_check.h"
#include "ringcomm/communicator.h"
#include "ringcomm/error.h"
#include "ringcomm/schedule.h"
#include "shm/shm_segment.h"
#include "shm/shm_wait.h"
#include "testing/core_round_trip.h"

namespace py = pybind11;

namespace ringcomm {
namespace {

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

void bindCpuEntryPoints(py::module_& testing) {
  testing.def(
      "column_count",
      [](Collective collective, int worldSize, size_t count, size_t sliceElems) {
        return columnCount(makePlan({collective, 0, worldSize, count, 0}), sliceElems);
      },
      py::arg("collective"), py::arg("world_size"), py::arg("count"), py::arg("slice_elems"));
  testing.def(
      "cpu_reduce",
      [](uintptr_t result, uintptr_t message, uintptr_t a, uintptr_t b, size_t n, DataType type,
         RedOp op, int divisor, bool finalize, std::optional<DataType> wire) {
        CpuReducer().reduce(address(result), address(message), address(a), address(b), n,
                            ReduceSpec{type, op, divisor, wire.value_or(type)}, finalize);
      },
      py::arg("result"), py::arg("message"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
      py::arg("wire_dtype") = py::none(), py::call_guard<py::gil_scoped_release>());

  // A yield gate of its own (shm_wait.h; the process's stays untouched), driven with made-up
  // yield durations.
  py::class_<YieldGate>(testing, "YieldGate")
      .def(py::init<>())
      .def(
          "note_yield",
          [](YieldGate& gate, double micros) {
            return gate.noteYield(std::chrono::duration_cast<YieldGate::Clock::duration>(
                std::chrono::duration<double, std::micro>(micros)));
          },
          py::arg("micros"))
      .def("may_yield", &YieldGate::mayYield)
      .def("yielding_is_off", &YieldGate::yieldingIsOff)
      .def("probe_period_seconds",
           [](const YieldGate& gate) {
             return std::chrono::duration<double>(gate.probePeriod()).count();
           })
      .def_property_readonly_static(
          "first_probe_seconds",
          [](py::object) { return std::chrono::duration<double>(YieldGate::kFirstProbe).count(); })
      .def_property_readonly_static(
          "last_probe_seconds",
          [](py::object) { return std::chrono::duration<double>(YieldGate::kLastProbe).count(); })
      .def_property_readonly_static("quiet_probes",
                                    [](py::object) { return YieldGate::kQuietProbes; });
  testing.def("core_round_trip_ns", &coreRoundTripNanos, py::arg("cpu_a"), py::arg("cpu_b"),
              py::arg("rounds") = 20000, py::arg("samples") = 5,
              py::call_guard<py::gil_scoped_release>());
  testing.def("remove_stale_segments", &ShmSegment::removeStale, py::arg("folder") = "/dev/shm",
              py::arg("min_age_seconds") = 60.0);
}

}  // namespace

#ifdef RINGCOMM_WITH_CUDA
void bindHostGpu(py::module_& testing);  // testing/cuda/bindings_host_gpu.cc
namespace testing {
void bindDeviceEntryPoints(py::module_& m);  // testing/cuda/bindings_device.cc
}
#endif

}  // namespace ringcomm

PYBIND11_MODULE(_testing, m) {
  m.doc() = "ringcomm's entry points for tests and benchmarks only";
  py::module_::import("ringcomm._C");  // its types and error translators, first
  // The waits of this module's copy of the core (host_gpu's transport) end on Ctrl-C too; what
  // the handler raised there is raised here, else _C's translator takes the error.
  ringcomm::python::installSignalCheck();
  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      std::rethrow_exception(thrown);
    } catch (const ringcomm::InterruptedError& e) {
      const std::string what = std::string("ringcomm: ") + e.what();
      if (!ringcomm::python::restoreHandlerException(what.c_str())) throw;
    }
  });
  ringcomm::bindCpuEntryPoints(m);
#ifdef RINGCOMM_WITH_CUDA
  ringcomm::bindHostGpu(m);
  ringcomm::testing::bindDeviceEntryPoints(m);
#endif
}
