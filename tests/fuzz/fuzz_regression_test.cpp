// Replays every committed fuzz input (tests/fuzz/corpus/<target>/*: the seeds, and each crash the
// fuzzers ever found, kept as a regression) through the same target functions the fuzzers run.
// Built with the normal compiler everywhere, so a fixed crash stays fixed without clang.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../test_paths.h"
#include "fuzz_targets.h"

namespace fs = std::filesystem;

namespace ossrt::fuzz {
// Test names and messages show the target's name (not its bytes).
void PrintTo(const Target& target, std::ostream* os) { *os << target.name; }
}  // namespace ossrt::fuzz

namespace {

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> files;
  fs::path dir = ossrt::testing::source_dir() / "tests" / "fuzz" / "corpus" / target;
  if (!fs::is_directory(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

class FuzzRegression : public ::testing::TestWithParam<ossrt::fuzz::Target> {};

TEST_P(FuzzRegression, EveryCommittedInputRunsClean) {
  const auto& target = GetParam();
  auto files = inputs_of(target.name);
  // Every target has seeds: an empty corpus would make this test unable to fail.
  ASSERT_FALSE(files.empty()) << "tests/fuzz/corpus/" << target.name << " has no inputs";
  for (const auto& file : files) {
    SCOPED_TRACE(file.string());
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    target.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzRegression, ::testing::ValuesIn(ossrt::fuzz::targets()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
