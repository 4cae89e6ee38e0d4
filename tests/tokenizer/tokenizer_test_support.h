#pragma once
// Shared by the tokenizer tests (tests/unit/tokenizer_*_test.cpp): the real gpt-oss tokenizer
// loaded once per test binary, the JavaScript reference run through node, and seeded text
// generators for long inputs.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace ossrt::tokenizer_test {

inline std::filesystem::path source_dir() {
  const char* env = std::getenv("OSSRT_SOURCE_DIR");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(OSSRT_SOURCE_DIR);
}

inline std::filesystem::path js_package_dir() {
  return source_dir() / "third_party" / "npm" / "node_modules" / "@lenml" / "tokenizer-gptoss";
}

inline std::filesystem::path real_tokenizer_json() { return js_package_dir() / "models" / "tokenizer.json"; }

// Loaded once per test binary: parsing 28 MB of JSON takes about a second.
inline std::shared_ptr<const Tokenizer> real_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok =
      std::filesystem::exists(real_tokenizer_json()) ? Tokenizer::load(real_tokenizer_json().string()) : nullptr;
  return tok;
}

#define OSSRT_REQUIRE_REAL_TOKENIZER()                                                       \
  do {                                                                                       \
    if (!::ossrt::tokenizer_test::real_tokenizer()) {                                        \
      GTEST_SKIP() << "gpt-oss tokenizer.json not installed (run scripts/install-deps.sh): " \
                   << ::ossrt::tokenizer_test::real_tokenizer_json();                        \
    }                                                                                        \
  } while (0)

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline bool node_available() { return std::system("node --version > /dev/null 2>&1") == 0; }

// What the JavaScript tokenizer says (see tests/tokenizer/js_encode.cjs for the fields).
struct JsReference {
  std::vector<std::vector<int32_t>> ordinary;
  std::vector<std::vector<int32_t>> with_special;
  std::vector<std::string> decoded;
};

// Runs node on the texts and id lists; an empty optional-like result with `error` set on failure.
inline JsReference run_js_reference(const std::vector<std::string>& texts,
                                    const std::vector<std::vector<int32_t>>& id_lists, std::string& error) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ossrt_tok_js_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  const auto input = dir / "in.json", output = dir / "out.json";
  {
    std::ofstream out(input, std::ios::binary);
    out << nlohmann::json{{"texts", texts}, {"id_lists", id_lists}}.dump();
  }
  const std::string cmd = "node \"" + (source_dir() / "tests" / "tokenizer" / "js_encode.cjs").string() + "\" \"" +
                          input.string() + "\" \"" + output.string() + "\"";
  JsReference ref;
  if (std::system(cmd.c_str()) != 0) {
    error = "node failed: " + cmd;
  } else {
    const auto doc = nlohmann::json::parse(read_text_file(output));
    ref.ordinary = doc.at("ordinary").get<std::vector<std::vector<int32_t>>>();
    ref.with_special = doc.at("with_special").get<std::vector<std::vector<int32_t>>>();
    ref.decoded = doc.at("decoded").get<std::vector<std::string>>();
  }
  std::filesystem::remove_all(dir);
  return ref;
}

inline void append_code_point(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// `length` code points drawn from `fragments` (each fragment counts as its code points).
inline std::string random_mix(std::mt19937& rng, const std::vector<std::string>& fragments, size_t length) {
  std::string out;
  size_t code_points = 0;
  std::uniform_int_distribution<size_t> pick(0, fragments.size() - 1);
  while (code_points < length) {
    const std::string& f = fragments[pick(rng)];
    out += f;
    for (unsigned char c : f) code_points += (c & 0xC0) != 0x80;
  }
  return out;
}

}  // namespace ossrt::tokenizer_test
