#include "backend/registry/registry.h"

#include <fmt/ranges.h>

#include "backend/cpu/cpu_backend.h"
#ifdef OSSRT_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace ossrt {

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return make_cpu_backend(options);
#ifdef OSSRT_WITH_CUDA
  if (name == "cuda") return make_cuda_backend(options);
#endif
  fail("unknown or unavailable backend '{}' (available: {})", name, fmt::join(available_backends(), ", "));
}

std::vector<std::string> available_backends() {
#ifdef OSSRT_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

}  // namespace ossrt
