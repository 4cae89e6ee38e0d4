#pragma once
// The ossrt::Error type alone, without fmt: nvcc cannot compile fmt's C++20 consteval format
// checks, so CUDA launchers (.cu) include this and build their messages by hand. Everything else
// includes core/error.h, which adds fail() and OSSRT_CHECK.
#include <stdexcept>
#include <string>

namespace ossrt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace ossrt
