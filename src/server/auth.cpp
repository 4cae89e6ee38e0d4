#include "server/auth.h"

#include <fmt/format.h>

namespace ossrt::server {
namespace {

bool equal_constant_time(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

}  // namespace

std::optional<std::string> authenticate(const std::vector<std::string>& keys, std::string_view authorization) {
  if (keys.empty()) return std::string();
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() <= kBearer.size() || authorization.substr(0, kBearer.size()) != kBearer) return std::nullopt;
  std::string_view given = authorization.substr(kBearer.size());
  std::optional<std::string> principal;
  for (size_t i = 0; i < keys.size(); ++i)  // every key is compared: no early exit to time
    if (equal_constant_time(given, keys[i]) && !principal) principal = fmt::format("key:{}", i);
  return principal;
}

}  // namespace ossrt::server
