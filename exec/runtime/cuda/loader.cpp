// The CUDA back end's entry points in the executable of a CUDA build: each loads the module
// (libptdp_cuda.so: the CUDA runtime, cuBLAS, NCCL and ptdp's kernels) on first use and calls
// its function of the same name. Planning commands never call them, so they never load CUDA.
// The module resolves ptdp's own symbols against the executable (linked by module_imports.txt,
// exported by host_exports.list); a module that cannot be loaded reads as "no usable GPU".
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "exec/runtime/cuda/backend.hpp"

#ifndef PTDP_CUDA_MODULE_NAME
#error "loader.cpp needs PTDP_CUDA_MODULE_NAME (file name) and PTDP_CUDA_MODULE_BUILD_PATH (exec/runtime/cuda/CMakeLists.txt)"
#endif

namespace ptdp::exec::cuda {
namespace {

struct LoadedModule {
  const detail::ModuleEntryPoints* entry = nullptr;
  std::string problem;  // why entry is null
};

std::string directory_of_executable() {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "";
  const std::string path(self, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

LoadedModule load() {
  // $PTDP_CUDA_MODULE, else beside the executable (an installed or copied ptdp), else where
  // this build put it (the test programs in build/tests/…).
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("PTDP_CUDA_MODULE"); env && *env) candidates.push_back(env);
  if (const std::string dir = directory_of_executable(); !dir.empty()) candidates.push_back(dir + PTDP_CUDA_MODULE_NAME);
  candidates.push_back(PTDP_CUDA_MODULE_BUILD_PATH);
  LoadedModule m;
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) {
      if (m.problem.empty()) m.problem = "no " + path;
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      m.problem = why ? why : ("cannot load " + path);
      return m;
    }
    using EntryFunction = const detail::ModuleEntryPoints* (*)();
    auto entry = reinterpret_cast<EntryFunction>(::dlsym(handle, detail::kModuleEntrySymbol));
    const detail::ModuleEntryPoints* table = entry ? entry() : nullptr;
    if (table == nullptr || table->abi != detail::kModuleAbi || table->size != sizeof(detail::ModuleEntryPoints)) {
      m.problem = path + " is not the CUDA back end of this ptdp build (rebuild it with this ptdp)";
      return m;
    }
    m.entry = table;
    m.problem.clear();
    return m;
  }
  return m;
}

// Set once the module is loaded: a cuda device exists only then.
std::atomic<const detail::ModuleEntryPoints*> g_loaded{nullptr};

// Loaded once per process (thread-safe); never unloaded (its objects may outlive any caller).
const LoadedModule& module() {
  static const LoadedModule m = [] {
    LoadedModule loaded = load();
    g_loaded.store(loaded.entry);
    return loaded;
  }();
  return m;
}

std::string not_loadable() {
  return "--backend cuda: the CUDA back end of this ptdp cannot be loaded (" + module().problem +
         "); keep " PTDP_CUDA_MODULE_NAME " beside ptdp (or set PTDP_CUDA_MODULE), or use --backend cpu";
}

const detail::ModuleEntryPoints& entry_or_throw() {
  if (module().entry == nullptr) throw EnvironmentError(not_loadable());
  return *module().entry;
}

}  // namespace

std::string cuda_status() {
  if (module().entry == nullptr) return "cuda: compiled, back end not loadable (" + module().problem + ")";
  return module().entry->cuda_status();
}

int cuda_device_count() { return module().entry ? module().entry->cuda_device_count() : 0; }

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) { return entry_or_throw().make_cuda_device(options); }

ProcessGroups make_nccl_groups(Device& device, ProcessGroups mpi_groups, double timeout_s) {
  return entry_or_throw().make_nccl_groups(device, std::move(mpi_groups), timeout_s);
}

CalibrationResult calibrate_cuda(Communicator& world, const CalibrationOptions& options) {
  return entry_or_throw().calibrate_cuda(world, options);
}

namespace detail {

// Asked of every device (the cpu device too): without the module loaded no device is a cuda
// device, so they answer without loading it (`train --backend cpu` never loads CUDA).
std::unique_ptr<DeviceTimer> make_event_timer(Device& dev) {
  const ModuleEntryPoints* loaded = g_loaded.load();
  return loaded ? loaded->make_event_timer(dev) : nullptr;
}

std::optional<bool> device_any_inf_or_nan(Device& dev, const std::vector<std::pair<const float*, size_t>>& buffers) {
  const ModuleEntryPoints* loaded = g_loaded.load();
  if (loaded == nullptr) return std::nullopt;
  return loaded->device_any_inf_or_nan(dev, buffers);
}

std::string unavailable_reason() { return module().entry ? module().entry->unavailable_reason() : not_loadable(); }

}  // namespace detail
}  // namespace ptdp::exec::cuda
