#include "core/build_info.h"

namespace ossrt {

bool build_has_cuda() {
#ifdef OSSRT_BUILD_HAS_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace ossrt
