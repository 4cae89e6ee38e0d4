// A libFuzzer entry point for one target of fuzz_targets.h, chosen at build time
// (OSSRT_FUZZ_TARGET, one binary per target: tests/fuzz/CMakeLists.txt).
#include "fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ossrt::fuzz::OSSRT_FUZZ_TARGET(data, size);
  return 0;
}
