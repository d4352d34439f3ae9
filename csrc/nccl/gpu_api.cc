// The production GpuApi: the CUDA runtime's functions, and NCCL's through dlopen. The library is
// never closed: communicators may outlive any owner.
#include "nccl/gpu_api.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "ringcomm/error.h"

namespace ringcomm {
namespace {

constexpr const char* kSoname = "libnccl.so.2";

bool isDirectory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string asLibraryFile(const std::string& path) {
  return isDirectory(path) ? path + "/" + kSoname : path;
}

std::string loadedPath(void* handle, void* symbol) {
  Dl_info info{};
  if (symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr)
    return info.dli_fname;
  (void)handle;
  return kSoname;
}

template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, bool required, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (fn == nullptr && required) missing += std::string(missing.empty() ? "" : ", ") + name;
}

std::unique_ptr<GpuApi> loadFrom(void* handle, std::string& why) {
  auto api = std::make_unique<GpuApi>();
#define RC_TAKE_CUDA(ret, name, params) api->name = &::name;
#define RC_RESOLVE_NCCL(required, ret, name, params) resolve(handle, #name, api->name, required, missing);
  std::string missing;
  RC_CUDA_FUNCTIONS(RC_TAKE_CUDA)
  RC_NCCL_FUNCTIONS(RC_RESOLVE_NCCL)
#undef RC_TAKE_CUDA
#undef RC_RESOLVE_NCCL
  if (!missing.empty()) {
    why = "it lacks " + missing + " (NCCL 2.14 or newer is needed)";
    return nullptr;
  }
  api->ncclPath = loadedPath(handle, reinterpret_cast<void*>(api->ncclGetVersion));
  if (api->ncclGetVersion(&api->ncclVersion) != ncclSuccess) api->ncclVersion = 0;
  return api;
}

std::unique_ptr<GpuApi> tryOpen(const std::string& name, int flags, std::string& tried) {
  void* handle = dlopen(name.c_str(), flags);
  if (handle == nullptr) {
    if (!(flags & RTLD_NOLOAD)) {
      const char* err = dlerror();
      tried += "\n  " + name + ": " + (err ? err : "not found");
    }
    return nullptr;
  }
  std::string why;
  auto api = loadFrom(handle, why);
  if (!api) tried += "\n  " + name + ": " + why;
  return api;
}

std::unique_ptr<GpuApi> search(const NcclSearch& where) {
  std::string tried;
  const std::string& hint = where.hint;
  if (!where.library.empty()) {
    // An explicit choice is final: falling back silently would hide a typo.
    if (auto api = tryOpen(asLibraryFile(where.library), RTLD_NOW | RTLD_LOCAL, tried)) return api;
    RC_THROW("nccl_library=", where.library, " could not be used as NCCL:", tried);
  }
  if (auto api = tryOpen(kSoname, RTLD_NOW | RTLD_NOLOAD, tried)) return api;
  if (auto api = tryOpen(kSoname, RTLD_NOW | RTLD_LOCAL, tried)) return api;
  if (!hint.empty())
    if (auto api = tryOpen(asLibraryFile(hint), RTLD_NOW | RTLD_LOCAL, tried)) return api;
  RC_THROW("ringcomm could not load NCCL (", kSoname, "). Tried:", tried,
           "\nInstall it with `pip install nvidia-nccl-cu13` (or use the one PyTorch ships), "
           "or set RINGCOMM_NCCL_LIBRARY (the nccl_library option) to the library file.");
}

}  // namespace

std::string GpuApi::describe(ncclResult_t result, ncclComm_t comm) const {
  std::string text = ncclGetErrorString ? ncclGetErrorString(result) : "NCCL error";
  text += " (ncclResult_t " + std::to_string(static_cast<int>(result)) + ")";
  if (ncclGetLastError != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last) text += ": " + std::string(last);
  }
  return text;
}

std::string GpuApi::describe(cudaError_t status) const {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

const GpuApi& loadGpuApi(const NcclSearch& where) {
  static std::mutex mutex;
  static std::unique_ptr<GpuApi> api;
  std::lock_guard<std::mutex> lock(mutex);
  if (!api) api = search(where);  // a failure is not cached: a later search may succeed
  return *api;
}

}  // namespace ringcomm
