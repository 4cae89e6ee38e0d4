// Workloads: ShareGPT loading and vLLM's filters, JSONL request files, random prompts of exact
// lengths (token ids, and text through the real tokenizer), seeds and sweep streams.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "bench/dataset.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::bench {
namespace {

namespace fs = std::filesystem;

class BenchDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ossrt_bench_dataset_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  static std::shared_ptr<const Tokenizer> tokenizer() {
    static auto tok = Tokenizer::load(default_tokenizer_path());
    return tok;
  }
  fs::path dir_;
};

std::string words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ' ';
    s += fmt::format("word{}", i % 10);
  }
  return s;
}

TEST_F(BenchDataset, ShareGptPairsAndFilters) {
  nlohmann::json doc = nlohmann::json::array();
  auto conv = [](const std::string& human, const std::string& gpt) {
    return nlohmann::json{
        {"id", "x"}, {"conversations", {{{"from", "human"}, {"value", human}}, {{"from", "gpt"}, {"value", gpt}}}}};
  };
  doc.push_back(conv(words(20), words(30)));     // kept
  doc.push_back(conv("hi", words(30)));          // prompt < 4 tokens: dropped
  doc.push_back(conv(words(20), "ok"));          // reply < 4 tokens: dropped
  doc.push_back(conv(words(1100), words(10)));   // prompt > 1024 tokens: dropped
  doc.push_back(conv(words(900), words(1200)));  // prompt + reply > 2048: dropped
  doc.push_back({{"conversations", {{{"from", "human"}, {"value", "only one turn"}}}}});  // one turn: skipped
  doc.push_back(conv(words(40), words(50)));                                              // kept
  const std::string path = write("sharegpt.json", doc.dump());
  EXPECT_EQ(read_sharegpt_pairs(path).size(), 6u);

  DatasetOptions o;
  o.name = "sharegpt";
  o.path = path;
  o.seed = 3;
  auto w = make_workload(o, 2, tokenizer().get(), 0);
  ASSERT_EQ(w.size(), 2u);
  std::set<int64_t> prompt_lens;
  for (const auto& r : w) {
    EXPECT_EQ(r.prompt_len, int64_t(tokenizer()->encode(r.prompt_text).size()));
    EXPECT_GE(r.output_len, 4);
    prompt_lens.insert(r.prompt_len);
  }
  EXPECT_EQ(prompt_lens, (std::set<int64_t>{int64_t(tokenizer()->encode(words(20)).size()),
                                            int64_t(tokenizer()->encode(words(40)).size())}));
  // The reply's length unless --sharegpt-output-len says otherwise.
  for (const auto& r : w) {
    const std::string reply = r.prompt_text == words(20) ? words(30) : words(50);
    EXPECT_EQ(r.output_len, int64_t(tokenizer()->encode(reply).size()));
  }
  o.sharegpt_output_len = 7;
  for (const auto& r : make_workload(o, 2, tokenizer().get(), 0)) EXPECT_EQ(r.output_len, 7);
  // Same seed and stream, same order; more requests than pass the filters is an error naming the file.
  o.sharegpt_output_len = 0;
  EXPECT_EQ(make_workload(o, 2, tokenizer().get(), 0)[0].prompt_text, w[0].prompt_text);
  try {
    make_workload(o, 3, tokenizer().get(), 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sharegpt.json"), std::string::npos) << e.what();
  }
}

TEST_F(BenchDataset, JsonlRequestFile) {
  const std::string path =
      write("requests.jsonl",
            "{\"prompt\": [1, 2, 3, 4], \"max_tokens\": 9}\n"
            "\n"
            "{\"messages\": [{\"role\": \"user\", \"content\": \"hello there\"}], \"max_completion_tokens\": 5}\n"
            "{\"prompt\": \"plain text prompt\"}\n");
  DatasetOptions o;
  o.name = "file";
  o.path = path;
  auto w = make_workload(o, 5, tokenizer().get(), 0);
  ASSERT_EQ(w.size(), 5u);
  EXPECT_EQ(w[0].prompt_len, 4);
  EXPECT_EQ(w[0].output_len, 9);
  EXPECT_EQ(w[1].prompt_len, int64_t(tokenizer()->encode("hello there").size()));
  EXPECT_EQ(w[1].output_len, 5);
  EXPECT_EQ(w[2].prompt_len, int64_t(tokenizer()->encode("plain text prompt").size()));
  EXPECT_EQ(w[2].output_len, 0);
  EXPECT_EQ(w[3].body, w[0].body);  // replay starts over after the last line
  EXPECT_EQ(w[1].body["messages"][0]["content"], "hello there");

  const std::string bad = write("bad.jsonl", "{\"prompt\": [1]}\n{not json}\n");
  o.path = bad;
  try {
    make_workload(o, 1, tokenizer().get(), 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  o.path = write("array.jsonl", "[1, 2]\n");
  EXPECT_THROW(make_workload(o, 1, tokenizer().get(), 0), Error);
}

TEST_F(BenchDataset, WarmupRequestsLeaveTheMeasuredOnesAlone) {
  // A file: the measured replay starts at line 1 whatever --warmup is; warm-up sends the last lines.
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += "{\"prompt\": [" + std::to_string(i + 1) + "], \"max_tokens\": 2}\n";
  DatasetOptions f;
  f.name = "file";
  f.path = write("five.jsonl", lines);
  const auto measured = make_workload(f, 3, nullptr, 0);
  ASSERT_EQ(measured.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(measured[size_t(i)].body["prompt"][0], i + 1);
  const auto warm = make_warmup_workload(f, 2, nullptr, 0);
  ASSERT_EQ(warm.size(), 2u);
  EXPECT_EQ(warm[0].body["prompt"][0], 4);
  EXPECT_EQ(warm[1].body["prompt"][0], 5);
  const auto wraps = make_warmup_workload(f, 7, nullptr, 0);  // more than the file: the last 7 of a cycle
  EXPECT_EQ(wraps[0].body["prompt"][0], 4);
  EXPECT_EQ(wraps[6].body["prompt"][0], 5);
  EXPECT_TRUE(make_warmup_workload(f, 0, nullptr, 0).empty());
  // Random: warm-up prompts are none of the measured ones, and repeatable.
  DatasetOptions r;
  r.input_len = 32;
  r.output_len = 4;
  r.seed = 5;
  const auto a = make_workload(r, 20, tokenizer().get(), 0);
  const auto w = make_warmup_workload(r, 20, tokenizer().get(), 0);
  std::set<std::vector<int32_t>> seen;
  for (const auto& x : a) seen.insert(x.prompt_ids);
  for (const auto& x : w) {
    EXPECT_EQ(x.prompt_len, 32);
    EXPECT_EQ(seen.count(x.prompt_ids), 0u);
  }
  EXPECT_EQ(make_warmup_workload(r, 20, tokenizer().get(), 0)[3].prompt_ids, w[3].prompt_ids);
  EXPECT_NE(make_warmup_workload(r, 20, tokenizer().get(), 1)[3].prompt_ids, w[3].prompt_ids);
}

TEST_F(BenchDataset, RandomTokenIdsOfExactLengthsWithSharedPrefix) {
  DatasetOptions o;
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.5;
  o.prefix_len = 16;
  o.seed = 9;
  const auto a = make_workload(o, 50, tokenizer().get(), 0);
  const auto b = make_workload(o, 50, tokenizer().get(), 1);
  std::set<int64_t> lens;
  for (const auto& r : a) {
    EXPECT_EQ(r.prompt_len, int64_t(r.prompt_ids.size()));
    EXPECT_GE(r.prompt_len, 16 + 50);
    EXPECT_LE(r.prompt_len, 16 + 150);
    EXPECT_GE(r.output_len, 10);
    EXPECT_LE(r.output_len, 30);
    EXPECT_TRUE(std::equal(a[0].prompt_ids.begin(), a[0].prompt_ids.begin() + 16, r.prompt_ids.begin()));
    for (int32_t id : r.prompt_ids) EXPECT_FALSE(tokenizer()->is_special(id));
    lens.insert(r.prompt_len);
  }
  EXPECT_GT(lens.size(), 10u) << "lengths vary with --range-ratio";
  // Another sweep point: the same shared prefix, different prompts.
  EXPECT_TRUE(std::equal(a[0].prompt_ids.begin(), a[0].prompt_ids.begin() + 16, b[0].prompt_ids.begin()));
  EXPECT_NE(a[0].prompt_ids, b[0].prompt_ids);
  // Same seed and stream: the same workload.
  EXPECT_EQ(make_workload(o, 50, tokenizer().get(), 0)[7].prompt_ids, a[7].prompt_ids);
  o.seed = 10;
  EXPECT_NE(make_workload(o, 50, tokenizer().get(), 0)[7].prompt_ids, a[7].prompt_ids);
}

TEST_F(BenchDataset, RandomTextPromptsEncodeToTheirLength) {
  DatasetOptions o;
  o.input_len = 64;
  o.output_len = 8;
  o.text_prompts = true;
  const auto w = make_workload(o, 20, tokenizer().get(), 0);
  int exact = 0;
  for (const auto& r : w) {
    EXPECT_TRUE(r.prompt_ids.empty());
    EXPECT_EQ(r.prompt_len, int64_t(tokenizer()->encode(r.prompt_text).size())) << "recorded length is the text's own";
    exact += r.prompt_len == 64;
  }
  EXPECT_GE(exact, 18) << "nearly every prompt has the exact length";
}

}  // namespace
}  // namespace ossrt::bench
