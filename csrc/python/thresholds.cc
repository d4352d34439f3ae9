// CommOptions' algorithm thresholds by name (python/bindings.h).
#include <map>
#include <string>

#include "python/bindings.h"
#include "ringcomm/error.h"

namespace ringcomm::python {

std::string thresholdName(const AlgorithmInfo& row) { return std::string(row.name) + "_max_bytes"; }

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

}  // namespace ringcomm::python
