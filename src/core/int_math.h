#pragma once
// Integer arithmetic the modules share (one definition, so unity builds see no clashing copies).
#include <cstdint>

namespace ossrt {

// a / b rounded up, for a >= 0 and b > 0 (block counts of token ranges and the like).
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace ossrt
