// The host implementation of GpuApi described in host_gpu.h: the table and the bookkeeping
// (host_cuda.cc, host_graphs.cc and host_nccl.cc hold the functions).
#include "testing/cuda/host_gpu.h"

#include <mutex>

#include "testing/cuda/host_internal.h"

namespace ringcomm::hostgpu {
namespace {

std::mutex statsMutex;
std::map<std::string, uint64_t> counts;
std::vector<std::string> misuse;

}  // namespace

void count(const char* name) {
  std::lock_guard<std::mutex> lock(statsMutex);
  ++counts[name];
}

void violation(const std::string& what) {
  std::lock_guard<std::mutex> lock(statsMutex);
  misuse.push_back(what);
}

const GpuApi& api() {
  static const GpuApi table = [] {
    GpuApi a;
    fillCuda(a);
    fillNccl(a);
    return a;
  }();
  return table;
}

std::map<std::string, uint64_t> callCounts() {
  std::lock_guard<std::mutex> lock(statsMutex);
  return counts;
}

std::vector<std::string> violations() {
  std::lock_guard<std::mutex> lock(statsMutex);
  return misuse;
}

void reset() {
  std::lock_guard<std::mutex> lock(statsMutex);
  counts.clear();
  misuse.clear();
}

}  // namespace ringcomm::hostgpu
