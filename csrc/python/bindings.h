// What the binding files of ringcomm._C (csrc/python/bind_*.cc, gathered by module.cc)
// share: raw addresses from Python integers, CommOptions' threshold names, and each area's
// binding function.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ringcomm/algorithms.h"

namespace pybind11 {
class module_;
class dict;
class object;
class tuple;
}  // namespace pybind11

namespace ringcomm {
class Communicator;
}

namespace ringcomm::python {

inline void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

// CommOptions' field for an algorithm's auto threshold: "<name>_max_bytes".
std::string thresholdName(const AlgorithmInfo& row);
// Thresholds by their CommOptions names; the ones not given keep kAlgorithms' defaults.
AlgorithmThresholds thresholdsFrom(const std::map<std::string, size_t>& given);

void bindTables(pybind11::module_& m);         // enums, kCollectives' columns, build_info
void bindPlans(pybind11::module_& m);          // make_plan, choose_algorithm
void bindRequest(pybind11::module_& m);        // CollectiveRequest and its debug header
void bindTransports(pybind11::module_& m);     // Transport, Reducer and the CPU ones
void bindCommunicator(pybind11::module_& m);   // Communicator, its traffic
void bindTcp(pybind11::module_& m);            // SocketTransport
void bindRouterGate(pybind11::module_& m);     // RouterGate (router_gate.cc)
// Communicator.all_reduce's or broadcast's entry (`collective`) bound to `comm`
// (in_place_entry.cc): runs a plain call at once under `gate` (a RouterGate) when its ring is
// open, the `queue`'s last call is None or on_worker(), and no observer (owner, name) is set; else
// calls `fallback(owner, *args, **kwargs)`. `owner`: the Python communicator, held by a weak
// reference. `tensor_type` (torch.Tensor) and `tensor_dtypes` ({torch dtype: DataType}) say
// which tensors.
pybind11::object inPlaceEntry(std::shared_ptr<Communicator> comm, Collective collective,
                              Algorithm algorithm, pybind11::object owner,
                              pybind11::object fallback, pybind11::object gate,
                              pybind11::object queue, pybind11::object on_worker,
                              pybind11::tuple observers,
                              pybind11::object tensor_type, pybind11::dict tensor_dtypes);
// With CUDA only (python/cuda/): device queries, NCCL, CudaTransportAndReducer.
void bindCuda(pybind11::module_& m);

}  // namespace ringcomm::python
