#pragma once
// Backends by name, for whoever picks one at start-up (the engine's session, the server's runtime,
// ParallelModel's ranks, tools and tests). Its own module above the implementations, so that code
// written against the op interface (the model) cannot create a backend: it is handed one.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace ossrt {

// Creates a backend by name: "cpu" (always), "cuda" (when built with CUDA). Throws on others.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options = {});
std::vector<std::string> available_backends();

}  // namespace ossrt
