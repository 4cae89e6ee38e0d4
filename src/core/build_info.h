#pragma once
// What build this binary is: the git commit it was built from (with "+dirty" when src/, tools/
// or CMake files differed from it), written at build time by cmake/build_info.cmake. Benchmarks
// and the server's /v1/server_info report it, so every result names the code that produced it.
#include <string>

namespace ossrt {

// "<40 hex digits>" or "<40 hex digits>+dirty"; "unknown" outside a git checkout.
std::string build_commit();
// True when the CUDA backend is compiled in.
bool build_has_cuda();

}  // namespace ossrt
