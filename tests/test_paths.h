#pragma once
// Where tests find the repository's files (fixtures, corpora): $OSSRT_SOURCE_DIR when set (ctest
// sets it; so do the device scripts, whose checkout lives elsewhere), else the source directory the
// test was built from. No test hard-codes a checkout's path.
#include <cstdlib>
#include <filesystem>

namespace ossrt::testing {

inline std::filesystem::path source_dir() {
  const char* env = std::getenv("OSSRT_SOURCE_DIR");
  return std::filesystem::path(env && *env ? env : OSSRT_SOURCE_DIR);
}

inline std::filesystem::path golden_dir() { return source_dir() / "tests" / "golden"; }

}  // namespace ossrt::testing
