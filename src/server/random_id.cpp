#include "server/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>

#include "core/error.h"

namespace ossrt::server {

std::string random_id(std::string_view prefix) {
  uint8_t bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    // getrandom never returns short for <= 256 bytes once the pool is initialised; EINTR is the
    // one retryable failure.
    ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      OSSRT_CHECK(errno == EINTR, "getrandom failed (errno {}): cannot make an unguessable id", errno);
      continue;
    }
    filled += size_t(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  id.reserve(prefix.size() + 2 * sizeof(bytes));
  for (uint8_t b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

}  // namespace ossrt::server
