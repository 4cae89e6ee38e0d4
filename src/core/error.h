#pragma once
// Errors: load-time and request-time failures throw ossrt::Error with a message a user can act on
// (which file, which tensor, which field). The step path does not throw.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

#include "core/error_type.h"

namespace ossrt {

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ossrt

// Throws ossrt::Error with a formatted message when cond is false.
#define OSSRT_CHECK(cond, ...)               \
  do {                                       \
    if (!(cond)) ::ossrt::fail(__VA_ARGS__); \
  } while (0)
