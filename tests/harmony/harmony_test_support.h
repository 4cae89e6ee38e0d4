#pragma once
// Shared helpers of the harmony unit tests: the real gpt-oss tokenizer and the golden files.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ossrt::harmony::testing {

inline std::shared_ptr<const Tokenizer> tokenizer() {
  static std::shared_ptr<const Tokenizer> tok = Tokenizer::load(default_tokenizer_path());
  return tok;
}

inline std::string golden_path(const std::string& name) {
  return std::string(OSSRT_SOURCE_DIR) + "/tests/harmony/" + name;
}

inline std::string read_golden(const std::string& name) {
  std::ifstream in(golden_path(name), std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing golden file " << golden_path(name);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

inline std::vector<int32_t> read_ids(const std::string& name) {
  std::istringstream in(read_golden(name));
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

}  // namespace ossrt::harmony::testing
