// ringcomm._C's enums and tables: each generated from its table in types.h / algorithms.h, so a
// new row there needs nothing here; and build_info.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "python/bindings.h"
#include "ringcomm/algorithms.h"
#include "ringcomm/schedule.h"
#include "ringcomm/types.h"

namespace py = pybind11;

namespace ringcomm::python {
namespace {

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

void bindEnums(py::module_& m) {
  py::enum_<DataType> dataTypes(m, "DataType");
  for (const DataTypeInfo& row : kDataTypes) dataTypes.value(row.name, row.type);
  py::enum_<RedOp> redOps(m, "RedOp");
  for (const RedOpInfo& row : kRedOps) redOps.value(row.name, row.op);
  py::enum_<Collective> collectiveEnum(m, "Collective");
  for (const CollectiveInfo& row : kCollectives) collectiveEnum.value(row.name, row.collective);
  py::enum_<Algorithm> algorithms(m, "Algorithm");
  for (const AlgorithmInfo& row : kAlgorithms) algorithms.value(row.name, row.algorithm);
}

void bindAlgorithmTable(py::module_& m) {
  py::dict algorithmCollectives;  // name -> the collectives it plans (auto: accepts)
  for (const AlgorithmInfo& row : kAlgorithms) {
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
}

void bindCollectiveTable(py::module_& m) {
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
}

}  // namespace

void bindTables(py::module_& m) {
  bindEnums(m);
  bindAlgorithmTable(m);
  bindCollectiveTable(m);
  m.def("dtype_size", &dataTypeSize);
  m.def("dtype_is_floating", &isFloatingPoint, py::arg("dtype"),
        "Whether dtype is a floating-point type (has NaN and Inf; the table in types.h).");
  m.def(
      "op_supported", [](RedOp op, DataType type) { return opSupported(op, type); },
      py::arg("op"), py::arg("dtype"), "Whether op is defined for dtype (the table in types.h).");
  m.def("build_info", &buildInfo);
}

}  // namespace ringcomm::python
