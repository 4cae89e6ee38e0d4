#pragma once
#include <memory>

#include "backend/backend.h"

namespace ossrt {
// The reference backend: plain loops in fp32, threaded, obvious on purpose. The oracle for every test.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);
}  // namespace ossrt
