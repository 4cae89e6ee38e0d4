// Suffix decoding (engine/suffix_drafter.h): the tree's counts and its drafts against a brute-force
// scan of the same sequences, the drafter's per-request and shared trees, eviction, the
// --speculative-config fields, and the engine's greedy output unchanged with suffix drafts.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "engine/drafter.h"
#include "engine/suffix_drafter.h"
#include "engine_test_model.h"

using namespace ossrt;
using namespace testing_engine;

namespace {

using Seq = std::vector<int32_t>;

Seq random_seq(std::mt19937& rng, int len, int alphabet) {
  std::uniform_int_distribution<int> d(0, alphabet - 1);
  Seq s(static_cast<size_t>(len));
  for (auto& t : s) t = d(rng);
  return s;
}

// Occurrences of `s` in the sequences (each starting position counts once).
int brute_count(const std::vector<Seq>& seqs, const Seq& s) {
  int n = 0;
  for (const Seq& q : seqs)
    for (size_t i = 0; i + s.size() <= q.size(); ++i)
      if (std::equal(s.begin(), s.end(), q.begin() + std::ptrdiff_t(i))) ++n;
  return n;
}

// What follows the occurrences of `s` (those with a next token), by next token.
std::map<int32_t, int> brute_next(const std::vector<Seq>& seqs, const Seq& s) {
  std::map<int32_t, int> next;
  for (const Seq& q : seqs)
    for (size_t i = 0; i + s.size() < q.size(); ++i)
      if (std::equal(s.begin(), s.end(), q.begin() + std::ptrdiff_t(i))) ++next[q[i + s.size()]];
  return next;
}

// The drafting rule spelled out over brute-force counts (SuffixTree::speculate's contract): for
// each suffix length m < depth that occurs, walk the most frequent next token (lowest id on ties)
// while the string stays within `depth` tokens, the draft below min(max_tokens, factor * m) and the
// running probability >= min_prob; the largest sum of running probabilities wins, later m on ties.
SuffixTree::Draft brute_speculate(const std::vector<Seq>& seqs, const Seq& context, int depth, int max_tokens,
                                  double factor, double min_prob) {
  SuffixTree::Draft best;
  const int n = int(context.size());
  for (int m = 1; m <= std::min(n, depth - 1); ++m) {
    Seq s(context.end() - m, context.end());
    if (brute_count(seqs, s) == 0) break;
    SuffixTree::Draft d;
    d.match_len = m;
    double p = 1;
    const int limit = std::min(max_tokens, int(factor * m + 1e-9));
    while (int(d.tokens.size()) < limit && int(s.size()) < depth) {
      const auto next = brute_next(seqs, s);
      if (next.empty()) break;
      int total = 0;
      int32_t pick = -1;
      for (const auto& [t, c] : next) {
        total += c;
        if (pick < 0 || c > next.at(pick)) pick = t;  // map order: the lowest id wins ties
      }
      p *= double(next.at(pick)) / total;
      if (p < min_prob) break;
      d.tokens.push_back(pick);
      d.score += p;
      s.push_back(pick);
    }
    if (d.score >= best.score && !d.tokens.empty()) best = d;
  }
  return best;
}

}  // namespace

TEST(SuffixTree, CountsEveryStringUpToTheDepth) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int depth = 2 + trial % 6;
    SuffixTree tree(depth);
    std::vector<Seq> seqs;
    for (int k = 0; k < 3; ++k) {
      seqs.push_back(random_seq(rng, 10 + trial * 3, 3 + trial % 4));
      tree.add(seqs.back());
    }
    // Every string of length 1..depth + 1 at every position, and some that never occur.
    for (const Seq& q : seqs)
      for (size_t i = 0; i < q.size(); ++i)
        for (int len = 1; len <= depth + 1 && i + size_t(len) <= q.size(); ++len) {
          const Seq s(q.begin() + std::ptrdiff_t(i), q.begin() + std::ptrdiff_t(i) + len);
          EXPECT_EQ(tree.count(s), len <= depth ? brute_count(seqs, s) : 0) << "trial " << trial;
        }
    EXPECT_EQ(tree.count(Seq{99}), 0);
    EXPECT_EQ(tree.count(Seq{}), 0);
  }
}

TEST(SuffixTree, TakingASequenceOutLeavesTheOthersCounts) {
  std::mt19937 rng(11);
  SuffixTree tree(5);
  const Seq a = random_seq(rng, 40, 3), b = random_seq(rng, 40, 3);
  tree.add(a);
  tree.add(b);
  tree.add(a, -1);
  for (size_t i = 0; i < a.size(); ++i)
    for (int len = 1; len <= 5 && i + size_t(len) <= a.size(); ++len) {
      const Seq s(a.begin() + std::ptrdiff_t(i), a.begin() + std::ptrdiff_t(i) + len);
      EXPECT_EQ(tree.count(s), brute_count({b}, s));
    }
}

TEST(SuffixTree, DraftsEqualTheBruteForceRule) {
  std::mt19937 rng(3);
  int nonempty = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int depth = 3 + trial % 10;
    const int alphabet = 2 + trial % 5;
    std::vector<Seq> seqs;
    SuffixTree tree(depth);
    for (int k = 0; k < 1 + trial % 3; ++k) {
      seqs.push_back(random_seq(rng, 20 + trial % 40, alphabet));
      tree.add(seqs.back());
    }
    const Seq context = random_seq(rng, 1 + trial % 15, alphabet);
    const int max_tokens = 1 + trial % 8;
    const double factor = trial % 4 == 0 ? 0.5 : trial % 4 == 1 ? 1.0 : 3.0;
    const double min_prob = trial % 3 == 0 ? 0.0 : trial % 3 == 1 ? 0.1 : 0.4;
    const SuffixTree::Draft got = tree.speculate(context, max_tokens, factor, min_prob);
    const SuffixTree::Draft want = brute_speculate(seqs, context, depth, max_tokens, factor, min_prob);
    EXPECT_EQ(got.tokens, want.tokens) << "trial " << trial;
    EXPECT_EQ(got.match_len, want.match_len) << "trial " << trial;
    EXPECT_NEAR(got.score, want.score, 1e-12) << "trial " << trial;
    nonempty += !got.tokens.empty();
  }
  EXPECT_GT(nonempty, 100);  // the comparison was about real drafts
}

TEST(SuffixDrafter, DraftsFromTheRequestAndFromEarlierOutputs) {
  SpeculativeConfig c = parse_speculative_config(R"({"method": "suffix", "num_speculative_tokens": 6})");
  SuffixDrafter d(c);
  // A request that repeats a phrase: after its first words come again, the rest is drafted.
  const Seq phrase = {11, 12, 13, 14, 15, 16, 17};
  Seq tokens = {1, 2};
  tokens.insert(tokens.end(), phrase.begin(), phrase.end());
  tokens.insert(tokens.end(), {3, 4, 11, 12, 13});
  EXPECT_EQ(draft_guesses(d, 1, tokens, 2, 6), (Seq{14, 15, 16}));  // factor 1.0: at most the match (3)
  tokens.push_back(14);                                             // grown by one: the tree takes the new token only
  EXPECT_EQ(draft_guesses(d, 1, tokens, 2, 6), (Seq{15, 16, 17, 3}));
  EXPECT_EQ(d.num_tracked_requests(), 1u);

  // Another request has never seen the phrase: nothing to draft until the first one's output is shared.
  const Seq other = {5, 6, 11, 12, 13};
  EXPECT_TRUE(draft_guesses(d, 2, other, 2, 6).empty());
  d.finished(1, tokens, 2);
  EXPECT_EQ(d.num_tracked_requests(), 1u);
  EXPECT_EQ(d.num_cached_outputs(), 1u);
  EXPECT_EQ(draft_guesses(d, 2, other, 2, 6), (Seq{14, 15, 16}));
  // A prompt-only sequence adds nothing to the shared tree.
  d.finished(2, other, 5);
  EXPECT_EQ(d.num_cached_outputs(), 1u);
  EXPECT_EQ(d.num_tracked_requests(), 0u);
}

TEST(SuffixDrafter, EvictedOutputsAreForgotten) {
  SpeculativeConfig c = parse_speculative_config(
      R"({"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_cached_requests": 1})");
  SuffixDrafter d(c);
  d.finished(1, Seq{0, 21, 22, 23, 24, 25}, 1);
  EXPECT_EQ(draft_guesses(d, 9, Seq{7, 21, 22}, 1, 4), (Seq{23, 24}));
  d.finished(2, Seq{0, 31, 32, 33, 34}, 1);  // evicts the first output
  EXPECT_EQ(d.num_cached_outputs(), 1u);
  EXPECT_TRUE(draft_guesses(d, 10, Seq{7, 21, 22}, 1, 4).empty());
  EXPECT_EQ(draft_guesses(d, 11, Seq{7, 31, 32}, 1, 4), (Seq{33, 34}));
  // Many more: the shared tree is rebuilt now and then and keeps answering from the newest output.
  for (int r = 0; r < 50; ++r) d.finished(uint64_t(100 + r), Seq{0, 40 + r, 41 + r, 42 + r}, 1);
  EXPECT_EQ(d.num_cached_outputs(), 1u);
  EXPECT_EQ(draft_guesses(d, 12, Seq{7, 89, 90}, 1, 4), (Seq{91}));
  EXPECT_TRUE(draft_guesses(d, 13, Seq{7, 40, 41}, 1, 4).empty());
}

TEST(SuffixDrafter, MinTokenProbabilityStopsUnsureDrafts) {
  // After 1, 2 comes 3 twice and 4 once; after 1, 2, 3 comes 5 twice; then 9 once and 7 once.
  const Seq history = {1, 2, 3, 5, 9, 1, 2, 4, 9, 1, 2, 3, 5, 7};
  auto draft = [&](double min_prob) {
    SpeculativeConfig c;
    c.method = "suffix";
    c.num_speculative_tokens = 4;
    c.suffix_max_spec_factor = 4;
    c.suffix_min_token_prob = min_prob;
    SuffixDrafter d(c);
    d.finished(1, history, 0);
    return draft_guesses(d, 2, Seq{8, 1, 2}, 0, 4);
  };
  // Matched "1 2": 3 with p = 2/3, then 5 (p stays 2/3), then 7 (the lower id of two equals: p 1/3).
  EXPECT_EQ(draft(0.1), (Seq{3, 5, 7}));
  EXPECT_EQ(draft(0.5), (Seq{3, 5}));
  EXPECT_TRUE(draft(0.7).empty());
}

TEST(SpeculativeConfig, ParsesTheSuffixFields) {
  SpeculativeConfig c = parse_speculative_config(
      R"({"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_tree_depth": 32,
          "suffix_decoding_max_cached_requests": 100, "suffix_decoding_max_spec_factor": 2.5,
          "suffix_decoding_min_token_prob": 0.2})");
  EXPECT_EQ(c.method, "suffix");
  EXPECT_EQ(c.num_speculative_tokens, 5);
  EXPECT_EQ(c.suffix_max_tree_depth, 32);
  EXPECT_EQ(c.suffix_max_cached_requests, 100);
  EXPECT_DOUBLE_EQ(c.suffix_max_spec_factor, 2.5);
  EXPECT_DOUBLE_EQ(c.suffix_min_token_prob, 0.2);
  EXPECT_EQ(parse_speculative_config(R"({"method": "suffix"})").num_speculative_tokens, 8);
  EXPECT_NE(dynamic_cast<SuffixDrafter*>(make_drafter(c).get()), nullptr);
  for (const char* bad : {R"({"method": "suffix", "suffix_decoding_max_tree_depth": 1})",
                          R"({"method": "suffix", "suffix_decoding_min_token_prob": 1.5})",
                          R"({"method": "suffix", "suffix_decoding_max_spec_factor": 0})",
                          R"({"method": "suffix", "suffix_decoding_max_cached_requests": -1})",
                          R"({"method": "suffix", "suffix_decoding_min_token_prob": "high"})",
                          R"({"method": "suffix", "num_speculative_tokens": 99999999999})", R"({"method": "eagle"})"}) {
    EXPECT_THROW(parse_speculative_config(bad), Error) << bad;
  }
}

// ---------------------------------------------------------------- the engine

TEST(SuffixDrafterEngine, GreedyOutputIsUnchangedAndRepeatsAreDrafted) {
  SmallModel model(256, 80);
  SmallModel reference_model;
  // Prompts that repeat a phrase (drafted from the request's own tree) and prompts that share one
  // with earlier requests' outputs (drafted from the shared tree), crossing the 16-token window.
  std::vector<std::pair<std::string, Seq>> prompts;
  for (int i = 0; i < 8; ++i) {
    Seq p = random_prompt(3 + (i * 11) % 30, 900 + uint32_t(i));
    const Seq phrase(p.begin(), p.begin() + 3);
    for (int r = 0; r < 1 + i % 3; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
    prompts.emplace_back("q" + std::to_string(i), p);
  }
  EngineConfig c;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;
  c.block_size = 4;
  c.num_full_blocks = 512;
  c.start_thread = false;
  c.speculative = parse_speculative_config(R"({"method": "suffix", "num_speculative_tokens": 4,
                                               "suffix_decoding_max_spec_factor": 4, "suffix_decoding_min_token_prob": 0})");
  Engine engine(model.model, c);
  const int max_tokens = 24;
  // Two rounds: the second sees the first round's outputs in the shared tree.
  for (int round = 0; round < 2; ++round) {
    EventLog log;
    for (const auto& [id, p] : prompts) engine.submit(greedy_request(id, p, max_tokens), log.callback(id));
    engine.run_until_idle();
    for (const auto& [id, p] : prompts) {
      EXPECT_EQ(log.get(id).tokens, reference_greedy(reference_model.model, p, max_tokens)) << id << " round " << round;
      EXPECT_TRUE(log.get(id).finished);
    }
  }
  const GeneratorStats s = engine.stats();
  EXPECT_GT(s.spec_drafts, 0u);
  EXPECT_GT(s.spec_accepted_tokens, 0u);  // the second round's outputs repeat the first's exactly
  EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
}
