#include "core/npy.h"

#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace ossrt {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += fmt::format("{}, ", d);
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64,
  // ending in '\n'.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  OSSRT_CHECK(f.good(), "cannot open {} for writing", path);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic, 8);
  uint16_t hl = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&hl), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(n * 4));
  OSSRT_CHECK(f.good(), "write to {} failed", path);
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  OSSRT_CHECK(f.good(), "cannot open {}", path);
  char magic[8];
  f.read(magic, 8);
  OSSRT_CHECK(f.good() && std::memcmp(magic, "\x93NUMPY", 6) == 0, "{}: not a .npy file", path);
  uint32_t hl = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hl = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hl), 4);
  }
  OSSRT_CHECK(f.good() && hl < (1u << 20), "{}: bad .npy header length", path);
  std::string header(hl, '\0');
  f.read(header.data(), hl);
  NpyArray a;
  std::smatch m;
  OSSRT_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")), "{}: no descr", path);
  a.descr = m[1];
  OSSRT_CHECK(header.find("'fortran_order': False") != std::string::npos, "{}: fortran order unsupported", path);
  OSSRT_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), "{}: no shape", path);
  std::string dims = m[1];
  int64_t n = 1;
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= a.shape.back();
  }
  if (a.descr == "<f4") {
    a.f32.resize(size_t(n));
    f.read(reinterpret_cast<char*>(a.f32.data()), n * 4);
  } else if (a.descr == "<i4") {
    a.i32.resize(size_t(n));
    f.read(reinterpret_cast<char*>(a.i32.data()), n * 4);
  } else if (a.descr == "<i8") {
    std::vector<int64_t> tmp(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(tmp.data()), n * 8);
    a.i32.assign(tmp.begin(), tmp.end());
    a.descr = "<i4";
  } else {
    fail("{}: unsupported dtype {}", path, a.descr);
  }
  OSSRT_CHECK(f.good(), "{}: truncated data", path);
  return a;
}

}  // namespace ossrt
