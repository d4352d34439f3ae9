// ringcomm._testing's CUDA entry points: the kernels, and one round of a CUDA transport's
// publications, driven straight from the GPU tests and benchmarks (device_entry_points.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "ringcomm/error.h"
#include "testing/cuda/device_entry_points.h"

namespace py = pybind11;

namespace ringcomm::testing {

void bindDeviceEntryPoints(py::module_& m) {
  auto release = py::call_guard<py::gil_scoped_release>();
  m.def("reduce_kernel",
        [](uintptr_t result, uintptr_t message, uintptr_t a, uintptr_t b, size_t n, DataType type,
           RedOp op, int divisor, bool finalize, uintptr_t stream,
           std::optional<DataType> wire, int smsForNccl) {
          std::string why;  // collectives check this in Communicator::prepare
          RC_CHECK(opSupported(op, type, &why), why);
          reduceOnDevice(result, message, a, b, n, type, op, divisor, finalize, stream,
                         wire.value_or(type), smsForNccl);
        },
        py::arg("result"), py::arg("message"), py::arg("a"), py::arg("b"), py::arg("n"),
        py::arg("dtype"), py::arg("op"), py::arg("divisor") = 1, py::arg("finalize") = false,
        py::arg("stream") = 0, py::arg("wire_dtype") = py::none(),
        py::arg("nccl_sms"), release,
        "Enqueues result/message = op(a, b) on the current device; pointers are device addresses. "
        "With wire_dtype (float16/bfloat16 under float32), message and b are in wire_dtype");
  m.def("convert_kernel", &convertOnDevice, py::arg("result"), py::arg("message"), py::arg("src"),
        py::arg("src_is_wire"), py::arg("n"), py::arg("wire_dtype"), py::arg("stream") = 0,
        py::arg("nccl_sms"), release,
        "Enqueues result (float32) and message (wire_dtype) = src, which is in wire_dtype when "
        "src_is_wire");
  m.def("copy_kernel", &copyOnDevice, py::arg("result"), py::arg("message"), py::arg("src"),
        py::arg("bytes"), py::arg("stream") = 0, release);
  m.def("publication_round", &publicationRound, py::arg("handle"), py::arg("rank"),
        py::arg("stream"), py::arg("sources"), py::arg("bytes_per_rank"), py::arg("outputs"),
        release,
        "One round of the NCCL transport's publications (sources[phase] published, every "
        "rank's copied to outputs[phase][rank]), as a one-hop plan runs it");
}

}  // namespace ringcomm::testing
