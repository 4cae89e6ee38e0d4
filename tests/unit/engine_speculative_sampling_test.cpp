// Speculative decoding of SAMPLED requests (issue 17): the acceptance rule
// (sampling/speculative_rule.h) keeps the output distributed exactly as plain decoding's.
//
// - The rule alone, on hand-made distributions: the first emitted token over 200,000 seeded trials
//   follows p by a chi-square test, for point-mass guesses and for guesses drawn from a q vector;
//   a rule that resamples from p instead of the residual fails the same test.
// - The engine on the tiny model: the joint distribution of a 4-token continuation over 2,000
//   seeded requests matches the exact one (products of the processed conditional distributions,
//   computed here from plain single-sequence forwards with temperature, min-p, top-k and top-p
//   written out independently), with a drafter whose guesses are right sometimes and wrong
//   sometimes, and with one that draws its guesses from a q vector, also under logit bias and
//   penalties (a row's penalties count the guesses before it); the same test with an
//   acceptance rule that always accepts, or that resamples from p instead of the residual, exceeds
//   the threshold by far.
// - Seeded requests (penalties, logit bias, min_tokens, logprobs) emit exactly plain decoding's
//   tokens and logprobs with speculation on: for point-mass guesses the rule IS plain decoding's
//   draw, so this is the strongest check of the production path.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>

#include "engine/drafter.h"
#include "engine_test_model.h"
#include "sampling/sampler.h"
#include "sampling/speculative_rule.h"

namespace ossrt {
namespace {

using namespace testing_engine;

// ---------------------------------------------------------------- chi-square

// The chi-square value with `df` degrees of freedom exceeded with probability 0.001
// (Wilson-Hilferty; within 1% of the exact quantile for df >= 3).
double chi2_critical(int df) {
  const double z = 3.090232;  // the standard normal's 0.999 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct ChiSquare {
  double statistic = 0;
  int df = 0;
  double critical() const { return chi2_critical(df); }
  bool rejects() const { return statistic > critical(); }
};

// Goodness of fit of observed counts to expected probabilities over outcome keys; outcomes expected
// fewer than 5 times (or not at all) are pooled into one cell, so an impossible outcome counts.
template <typename Key>
ChiSquare chi_square(const std::map<Key, int>& observed, const std::map<Key, double>& expected, int n) {
  ChiSquare c;
  double pooled_expected = 0;
  int pooled_observed = 0;
  int cells = 0;
  for (const auto& [key, p] : expected) {
    const double e = p * n;
    const auto it = observed.find(key);
    const int o = it == observed.end() ? 0 : it->second;
    if (e < 5) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    c.statistic += (o - e) * (o - e) / e;
    ++cells;
  }
  for (const auto& [key, o] : observed)
    if (!expected.count(key)) pooled_observed += o;
  if (pooled_expected > 0 || pooled_observed > 0) {
    const double e = std::max(pooled_expected, 0.5);  // never divide by 0: an impossible outcome scores big
    c.statistic += (pooled_observed - e) * (pooled_observed - e) / e;
    ++cells;
  }
  c.df = cells - 1;
  return c;
}

// ---------------------------------------------------------------- broken rules (for the tests' power)

SpeculativeVerdict always_accept(const SpeculativeVerifyInput& in) {
  return {int(in.draft.size()), in.target_samples.back()};
}

// Accepts x with probability p(x) / q(x) but on rejection draws from p itself, not the residual.
SpeculativeVerdict resample_from_p(const SpeculativeVerifyInput& in) {
  const int k = int(in.draft.size());
  for (int i = 0; i < k; ++i) {
    const int32_t x = in.draft[size_t(i)];
    const std::vector<float>& p = in.target_probs[size_t(i)];
    const double qx = in.draft_probs.empty() ? 1.0 : in.draft_probs[size_t(i)][size_t(x)];
    if (speculative_uniform(in.seed, in.position + i, 0) * qx < p[size_t(x)]) continue;
    return {i, draw_from(p, speculative_uniform(in.seed, in.position + i, 1))};
  }
  return {k, in.target_samples.back()};
}

// ---------------------------------------------------------------- the rule alone

std::vector<float> normalized(std::vector<float> v) {
  double s = 0;
  for (float x : v) s += x;
  for (float& x : v) x = float(x / s);
  return v;
}

// k = 1 guesses at fixed p_1, p_2 (no model): the first emitted token must follow p_1.
ChiSquare rule_first_token_fit(const SpeculativeRule& rule, bool vector_q, int trials) {
  const std::vector<float> p1 = normalized({0.05f, 0.30f, 0.10f, 0.40f, 0.0f, 0.15f});
  const std::vector<float> p2 = normalized({0.2f, 0.2f, 0.2f, 0.1f, 0.1f, 0.2f});
  const std::vector<float> q = normalized({0.30f, 0.05f, 0.25f, 0.10f, 0.20f, 0.10f});
  const std::vector<float> point = {0, 0, 0, 1, 0, 0};  // the ngram case: always guesses token 3
  std::map<int, int> observed;
  for (int t = 0; t < trials; ++t) {
    const uint64_t seed = 1000 + uint64_t(t);
    const std::vector<float>& qv = vector_q ? q : point;
    // The drafter's draw and the target's draws, each from its own stream.
    const int32_t x = draw_from(qv, uniform_draw(seed ^ 0xd7af7ull, 0));
    const int32_t y1 = draw_from(p1, uniform_draw(seed, 0));
    const int32_t y2 = draw_from(p2, uniform_draw(seed, 1));
    const std::vector<int32_t> draft = {x}, samples = {y1, y2};
    const std::vector<std::vector<float>> qs = {qv}, ps = {p1, p2};
    SpeculativeVerifyInput in;
    in.draft = draft;
    in.target_samples = samples;
    in.target_probs = ps;
    if (vector_q) in.draft_probs = qs;
    in.seed = seed;
    const SpeculativeVerdict v = rule(in);
    ++observed[v.accepted > 0 ? x : v.next];
  }
  std::map<int, double> expected;
  for (size_t i = 0; i < p1.size(); ++i)
    if (p1[i] > 0) expected[int(i)] = p1[i];
  return chi_square(observed, expected, trials);
}

TEST(SpeculativeRule, FirstTokenFollowsTheTargetForPointAndVectorGuesses) {
  for (bool vector_q : {false, true}) {
    const ChiSquare good = rule_first_token_fit(speculative_sampling_rule, vector_q, 200000);
    EXPECT_FALSE(good.rejects()) << "vector_q " << vector_q << ": " << good.statistic << " > " << good.critical();
    const ChiSquare bad = rule_first_token_fit(resample_from_p, vector_q, 200000);
    EXPECT_TRUE(bad.rejects()) << "vector_q " << vector_q << ": " << bad.statistic << " <= " << bad.critical();
  }
}

TEST(SpeculativeRule, PointMassGuessesAcceptWhileTheyEqualTheDraws) {
  const std::vector<int32_t> draft = {4, 7, 9}, samples = {4, 7, 2, 5};
  SpeculativeVerifyInput in;
  in.draft = draft;
  in.target_samples = samples;
  const SpeculativeVerdict v = speculative_sampling_rule(in);
  EXPECT_EQ(v.accepted, 2);
  EXPECT_EQ(v.next, 2);
  const std::vector<int32_t> all = {4, 7, 9, 1};
  in.target_samples = all;
  EXPECT_EQ(speculative_sampling_rule(in).accepted, 3);
  EXPECT_EQ(speculative_sampling_rule(in).next, 1);  // the bonus token
}

TEST(SpeculativeRule, ARejectedVectorGuessDrawsFromTheResidual) {
  // p puts 0.5 on token 1 and 0.5 on token 2; q guessed token 1 with q = 1 on it: accepted with
  // probability 0.5, and every rejection must emit token 2 (the residual's only mass).
  const std::vector<std::vector<float>> p = {{0, 0.5f, 0.5f}, {1, 0, 0}}, q = {{0, 1, 0}};
  const std::vector<int32_t> draft = {1}, samples = {1, 0};
  int accepted = 0;
  for (int t = 0; t < 2000; ++t) {
    SpeculativeVerifyInput in;
    in.draft = draft;
    in.draft_probs = q;
    in.target_probs = p;
    in.target_samples = samples;
    in.seed = uint64_t(t);
    const SpeculativeVerdict v = speculative_sampling_rule(in);
    if (v.accepted == 1) {
      ++accepted;
      EXPECT_EQ(v.next, 0);
    } else {
      EXPECT_EQ(v.next, 2);
    }
  }
  EXPECT_NEAR(accepted, 1000, 120);
}

// ---------------------------------------------------------------- the engine

constexpr int kContinuation = 4;  // tokens per request
constexpr int kRequests = 2000;

SamplingParams sampled_params() {
  SamplingParams p;
  p.temperature = 0.45f;
  p.top_k = 4;
  p.top_p = 0.97f;
  p.min_p = 0.02f;
  p.max_tokens = kContinuation;
  p.ignore_eos = true;
  return p;
}

// Penalties on the output matter only where tokens repeat: a logit bias makes three tokens the
// likeliest at every position, and the penalties push back on each once it has been emitted.
SamplingParams penalized_params() {
  SamplingParams p = sampled_params();
  p.logit_bias = {{11, 3.0f}, {22, 3.0f}, {33, 2.5f}};
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.3f;
  return p;
}

using Path = std::vector<int32_t>;

// Bias -> penalties -> temperature -> min-p -> top-k -> top-p, written out on doubles (the order of
// logits_processing.h): repetition divides positive and multiplies negative logits of tokens in the
// prompt or the output, frequency and presence subtract per output occurrence and once.
std::vector<double> processed(std::vector<float> logits, const SamplingParams& sp, const Path& output,
                              const std::vector<int32_t>& prompt) {
  const size_t v = logits.size();
  for (const auto& [t, b] : sp.logit_bias) logits[size_t(t)] += b;
  std::map<int32_t, int> counts;
  for (int32_t t : output) ++counts[t];
  std::vector<bool> seen(v, false);
  for (int32_t t : prompt) seen[size_t(t)] = true;
  for (int32_t t : output) seen[size_t(t)] = true;
  for (size_t t = 0; t < v; ++t)
    if (seen[t]) logits[t] = logits[t] > 0 ? logits[t] / sp.repetition_penalty : logits[t] * sp.repetition_penalty;
  for (const auto& [t, n] : counts) logits[size_t(t)] -= sp.frequency_penalty * float(n) + sp.presence_penalty;
  double mx = -1e300;
  for (size_t i = 0; i < v; ++i) mx = std::max(mx, double(logits[i]) / sp.temperature);
  std::vector<double> prob(v);
  for (size_t i = 0; i < v; ++i) prob[i] = std::exp(double(logits[i]) / sp.temperature - mx);  // max is 1
  std::vector<size_t> order(v);
  for (size_t i = 0; i < v; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] > prob[b]; });
  std::vector<size_t> kept;
  for (size_t r = 0; r < v && int(r) < sp.top_k; ++r)
    if (prob[order[r]] >= sp.min_p) kept.push_back(order[r]);  // min-p against the max, which is 1
  double total = 0;
  for (size_t i : kept) total += prob[i];
  std::vector<double> out(v, 0.0);
  double cumulative = 0;
  for (size_t i : kept) {
    if (cumulative >= sp.top_p) break;
    out[i] = prob[i] / total;
    cumulative += out[i];
  }
  double s = 0;
  for (double x : out) s += x;
  for (double& x : out) x /= s;
  return out;
}

// Every continuation's exact probability, by walking the tree of supported tokens with plain
// forwards (rewinding the runner to try each alternative), plus each prefix's distribution.
struct ExactTree {
  std::map<Path, double> leaves;
  std::map<Path, std::vector<double>> next;  // prefix -> processed distribution of the next token
};

void walk(SingleSequenceRunner& runner, const SamplingParams& sp, const std::vector<int32_t>& prompt,
          const std::vector<float>& logits, Path& path, double prob, ExactTree& tree) {
  const std::vector<double> p = processed(logits, sp, path, prompt);
  tree.next[path] = p;
  const int base = runner.position();
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) continue;
    path.push_back(int32_t(t));
    if (int(path.size()) == kContinuation) {
      tree.leaves[path] = prob * p[t];
    } else {
      runner.rewind(base);
      const std::vector<float> l =
          runner.run(std::vector<int32_t>{int32_t(t)}, 1, SingleSequenceRunner::Logits::LastRow);
      walk(runner, sp, prompt, l, path, prob * p[t], tree);
    }
    path.pop_back();
  }
}

// Guesses from the exact tree: the likeliest next token at each guessed position (right with its
// probability), or for odd seeds the second likeliest (right less often); every third guess of a
// seed divisible by 3 is a token the target never samples (always wrong).
// With as_vectors, each guess comes with its point mass written out as a q row, which sends it
// through the rule's textbook path (accept with probability p(x) on the rule's own draw, else draw
// from the residual) instead of the comparison with the target's draw.
class TreeDrafter : public Drafter {
 public:
  TreeDrafter(const ExactTree& tree, int prompt_len, bool as_vectors = false)
      : tree_(tree), prompt_len_(prompt_len), as_vectors_(as_vectors) {}
  Draft propose(const DraftRequest& r) override {
    Path path(r.tokens.begin() + prompt_len_, r.tokens.end());
    Draft d;
    for (int i = 0; i < r.max_tokens; ++i) {
      const auto it = tree_.next.find(path);
      if (it == tree_.next.end()) break;
      std::vector<int32_t> ranked;
      for (size_t t = 0; t < it->second.size(); ++t) ranked.push_back(int32_t(t));
      std::sort(ranked.begin(), ranked.end(),
                [&](int32_t a, int32_t b) { return it->second[size_t(a)] > it->second[size_t(b)]; });
      int32_t guess = ranked[r.seed % 2];
      if (r.seed % 3 == 0 && (r.position + i) % 3 == 2) guess = ranked.back();
      d.tokens.push_back(guess);
      if (as_vectors_) {
        d.probs.emplace_back(it->second.size(), 0.0f);
        d.probs.back()[size_t(guess)] = 1.0f;
      }
      path.push_back(guess);
    }
    return d;
  }

 private:
  const ExactTree& tree_;
  int prompt_len_;
  bool as_vectors_;
};

// Draws its guesses from q = a mix of the target's (sharpened) top choice and a uniform over the
// first 8 ids, and says so: the speculative sampling rule's vector case.
class VectorDrafter : public Drafter {
 public:
  VectorDrafter(const ExactTree& tree, int prompt_len, int vocab)
      : tree_(tree), prompt_len_(prompt_len), vocab_(vocab) {}
  Draft propose(const DraftRequest& r) override {
    Path path(r.tokens.begin() + prompt_len_, r.tokens.end());
    Draft d;
    for (int i = 0; i < r.max_tokens; ++i) {
      const auto it = tree_.next.find(path);
      if (it == tree_.next.end()) break;
      std::vector<float> q(size_t(vocab_), 0.0f);
      const auto top = std::max_element(it->second.begin(), it->second.end()) - it->second.begin();
      q[size_t(top)] += 0.6f;
      for (int t = 0; t < 8; ++t) q[size_t(t)] += 0.4f / 8;
      const int32_t x = draw_from(q, uniform_draw(r.seed ^ 0xd7af7ull, uint64_t(r.position + i)));
      d.tokens.push_back(x);
      d.probs.push_back(std::move(q));
      path.push_back(x);
    }
    return d;
  }

 private:
  const ExactTree& tree_;
  int prompt_len_, vocab_;
};

class EngineSpeculativeSamplingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // 64 sequences and room for 3 guesses each.
    model_ = new SmallModel(256, 256);
    prompt_ = new std::vector<int32_t>(random_prompt(8, 4242));
    tree_ = new ExactTree();
    penalized_tree_ = new ExactTree();
    SmallModel reference;
    SingleSequenceRunner runner(reference.model, int(prompt_->size()) + kContinuation);
    for (auto [sp, tree] : {std::pair{sampled_params(), tree_}, std::pair{penalized_params(), penalized_tree_}}) {
      runner.reset();
      const std::vector<float> logits = runner.run(*prompt_, 0, SingleSequenceRunner::Logits::LastRow);
      Path path;
      walk(runner, sp, *prompt_, logits, path, 1.0, *tree);
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    delete prompt_;
    delete tree_;
    delete penalized_tree_;
  }

  static EngineConfig config(std::shared_ptr<Drafter> drafter) {
    EngineConfig c;
    c.max_num_seqs = 64;
    c.max_num_batched_tokens = 256;
    c.block_size = 4;
    c.num_full_blocks = 1024;
    c.max_queue = kRequests;  // every request submitted at once
    c.start_thread = false;
    if (drafter) {
      c.speculative.method = "ngram";
      c.speculative.num_speculative_tokens = 3;
      c.drafter = std::move(drafter);
    }
    return c;
  }

  // kRequests seeded requests of the same prompt; the fit of their continuations to the exact tree.
  static ChiSquare fit(EngineConfig c, GeneratorStats* stats = nullptr) { return fit(std::move(c), false, stats); }
  static ChiSquare fit(EngineConfig c, bool penalized, GeneratorStats* stats) {
    const auto start = std::chrono::steady_clock::now();
    Engine engine(model_->model, std::move(c));
    EventLog log;
    for (int i = 0; i < kRequests; ++i) {
      GenerationRequest r;
      r.id = std::to_string(i);
      r.prompt_ids = *prompt_;
      r.sampling = penalized ? penalized_params() : sampled_params();
      r.sampling.seed = 90000 + uint64_t(i);
      EXPECT_TRUE(engine.submit(std::move(r), log.callback(std::to_string(i))));
    }
    engine.run_until_idle();
    std::map<Path, int> observed;
    for (int i = 0; i < kRequests; ++i) {
      const EventLog::Stream s = log.get(std::to_string(i));
      EXPECT_TRUE(s.finished);
      EXPECT_EQ(int(s.tokens.size()), kContinuation);
      ++observed[s.tokens];
    }
    if (stats) *stats = engine.stats();
    const ChiSquare chi = chi_square(observed, (penalized ? penalized_tree_ : tree_)->leaves, kRequests);
    std::printf("chi-square %.1f (df %d, threshold %.1f at p = 0.001) in %.1f s\n", chi.statistic, chi.df,
                chi.critical(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return chi;
  }

  static SmallModel* model_;
  static std::vector<int32_t>* prompt_;
  static ExactTree* tree_;
  static ExactTree* penalized_tree_;  // the same with repetition, frequency and presence penalties
};

SmallModel* EngineSpeculativeSamplingTest::model_ = nullptr;
std::vector<int32_t>* EngineSpeculativeSamplingTest::prompt_ = nullptr;
ExactTree* EngineSpeculativeSamplingTest::tree_ = nullptr;
ExactTree* EngineSpeculativeSamplingTest::penalized_tree_ = nullptr;

TEST_F(EngineSpeculativeSamplingTest, TheExactTreeIsADistribution) {
  double total = 0;
  for (const auto& [path, p] : tree_->leaves) total += p;
  EXPECT_NEAR(total, 1.0, 1e-9);
  EXPECT_GT(tree_->leaves.size(), 20u);  // a spread worth testing
}

TEST_F(EngineSpeculativeSamplingTest, PlainDecodingMatchesTheExactDistribution) {
  const ChiSquare chi = fit(config(nullptr));  // the oracle's own check
  EXPECT_FALSE(chi.rejects()) << chi.statistic << " > " << chi.critical();
}

TEST_F(EngineSpeculativeSamplingTest, PointMassGuessesKeepTheDistribution) {
  GeneratorStats s;
  const ChiSquare chi = fit(config(std::make_shared<TreeDrafter>(*tree_, int(prompt_->size()))), &s);
  EXPECT_FALSE(chi.rejects()) << chi.statistic << " > " << chi.critical();
  // The guesses were right sometimes and wrong sometimes.
  EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 5);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens * 4 / 5);
}

TEST_F(EngineSpeculativeSamplingTest, PointMassesAsVectorsTakeTheTextbookPathAndKeepTheDistribution) {
  // The rule on host distributions with its own draws: a different sample from the one above
  // (the tokens are not plain decoding's for the seed), the same distribution.
  GeneratorStats s;
  const ChiSquare chi = fit(config(std::make_shared<TreeDrafter>(*tree_, int(prompt_->size()), true)), &s);
  EXPECT_FALSE(chi.rejects()) << chi.statistic << " > " << chi.critical();
  EXPECT_GT(s.spec_accepted_tokens, s.spec_draft_tokens / 5);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens * 4 / 5);
}

TEST_F(EngineSpeculativeSamplingTest, GuessesDrawnFromAVectorKeepTheDistribution) {
  GeneratorStats s;
  const ChiSquare chi =
      fit(config(std::make_shared<VectorDrafter>(*tree_, int(prompt_->size()), small_engine_config().vocab_size)), &s);
  EXPECT_FALSE(chi.rejects()) << chi.statistic << " > " << chi.critical();
  EXPECT_GT(s.spec_accepted_tokens, 0u);
  EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
}

TEST_F(EngineSpeculativeSamplingTest, PenaltiesKeepTheDistributionForPointAndVectorGuesses) {
  // A verify row counts the guesses before it in its penalties; the exact tree counts the path.
  EXPECT_NE(tree_->leaves, penalized_tree_->leaves);
  const int prompt_len = int(prompt_->size());
  const int vocab = small_engine_config().vocab_size;
  // Plain decoding (the oracle's own check), point-mass guesses (the target's draws, on rows whose
  // penalties count the guesses), guesses from a q vector (Sampler::distribution on those rows).
  for (int drafter = 0; drafter < 3; ++drafter) {
    std::shared_ptr<Drafter> d;
    if (drafter == 1) d = std::make_shared<TreeDrafter>(*penalized_tree_, prompt_len);
    if (drafter == 2) d = std::make_shared<VectorDrafter>(*penalized_tree_, prompt_len, vocab);
    GeneratorStats s;
    const ChiSquare chi = fit(config(d), /*penalized=*/true, &s);
    EXPECT_FALSE(chi.rejects()) << "drafter " << drafter << ": " << chi.statistic << " > " << chi.critical();
    if (drafter) {
      EXPECT_GT(s.spec_accepted_tokens, 0u) << drafter;
    }
  }
}

TEST_F(EngineSpeculativeSamplingTest, AlwaysAcceptingFailsTheTest) {
  EngineConfig c = config(std::make_shared<TreeDrafter>(*tree_, int(prompt_->size())));
  c.speculative_rule = always_accept;
  const ChiSquare chi = fit(std::move(c));
  EXPECT_TRUE(chi.rejects()) << chi.statistic << " <= " << chi.critical();
}

TEST_F(EngineSpeculativeSamplingTest, ResamplingFromPInsteadOfTheResidualFailsTheTest) {
  for (bool vector_q : {false, true}) {
    std::shared_ptr<Drafter> d;
    if (vector_q)
      d = std::make_shared<VectorDrafter>(*tree_, int(prompt_->size()), small_engine_config().vocab_size);
    else
      d = std::make_shared<TreeDrafter>(*tree_, int(prompt_->size()));
    EngineConfig c = config(std::move(d));
    c.speculative_rule = resample_from_p;
    c.speculative_rule_needs_probs = true;
    const ChiSquare chi = fit(std::move(c));
    EXPECT_TRUE(chi.rejects()) << "vector_q " << vector_q << ": " << chi.statistic << " <= " << chi.critical();
  }
}

// ---------------------------------------------------------------- seeded: identical to plain decoding

// Replays known continuations of known prompts, every third guess wrong.
class ReplayDrafter : public Drafter {
 public:
  std::map<std::vector<int32_t>, std::vector<int32_t>> known;
  Draft propose(const DraftRequest& r) override {
    Draft d;
    for (const auto& [prompt, cont] : known) {
      if (r.tokens.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), r.tokens.begin())) continue;
      for (size_t i = r.tokens.size() - prompt.size(); i < cont.size() && int(d.tokens.size()) < r.max_tokens; ++i)
        d.tokens.push_back(i % 3 == 2 ? (cont[i] + 1) % 500 : cont[i]);
      break;
    }
    return d;
  }
};

TEST_F(EngineSpeculativeSamplingTest, SeededRequestsEmitPlainDecodingsTokensAndLogprobs) {
  // Prompts with a repeated phrase (the ngram drafter finds it), 24 tokens out, every sampling
  // feature that may speculate; with speculation on, each request's tokens and logprobs are those
  // of plain decoding with the same seed.
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    std::vector<int32_t> prompt = random_prompt(6 + i, 300 + uint32_t(i), 40);  // a small alphabet repeats
    for (int rep = 0; rep < 3; ++rep) prompt.insert(prompt.end(), prompt.begin(), prompt.begin() + 4);
    r.prompt_ids = prompt;
    r.sampling.temperature = i % 4 == 0 ? 0.0f : 0.3f + 0.1f * float(i % 5);
    r.sampling.top_k = i % 3 == 0 ? 0 : 8;
    r.sampling.top_p = i % 2 ? 0.9f : 1.0f;
    r.sampling.min_p = i % 5 == 1 ? 0.05f : 0.0f;
    if (i % 3 == 1) r.sampling.frequency_penalty = 0.4f;
    if (i % 4 == 2) r.sampling.presence_penalty = 0.3f;
    if (i % 5 == 3) r.sampling.repetition_penalty = 1.3f;
    if (i % 6 == 5) r.sampling.logit_bias = {{prompt[1], 2.0f}};
    if (i % 4 == 1) r.sampling.logprobs = 2;
    r.sampling.min_tokens = i % 3 == 2 ? 10 : 0;
    r.sampling.stop_token_ids = {prompt[2]};  // suppressed below min_tokens
    r.sampling.max_tokens = 24;
    r.sampling.seed = 31 + uint64_t(i);
    requests.push_back(std::move(r));
  }
  // Mode 1: the ngram drafter; mode 2: a replay of plain decoding's tokens with every third guess
  // wrong, so that every request, sampled ones included, verifies guesses right and wrong.
  std::map<std::string, EventLog::Stream> plain;
  for (int mode = 0; mode < 3; ++mode) {
    EngineConfig c = config(nullptr);
    c.max_num_seqs = 16;
    if (mode) {
      c.speculative.method = "ngram";
      c.speculative.num_speculative_tokens = 3;
      c.speculative.prompt_lookup_max = 2;
    }
    if (mode == 2) {
      auto replay = std::make_shared<ReplayDrafter>();
      for (const GenerationRequest& r : requests) replay->known[r.prompt_ids] = plain[r.id].tokens;
      c.drafter = replay;
    }
    Engine engine(model_->model, c);
    EventLog log;
    for (const GenerationRequest& r : requests) engine.submit(r, log.callback(r.id));
    engine.run_until_idle();
    for (const GenerationRequest& r : requests) {
      const EventLog::Stream s = log.get(r.id);
      ASSERT_TRUE(s.finished) << r.id;
      if (!mode) {
        plain[r.id] = s;
        continue;
      }
      EXPECT_EQ(s.tokens, plain[r.id].tokens) << r.id;
      EXPECT_EQ(s.final_event.finish_reason, plain[r.id].final_event.finish_reason) << r.id;
      std::vector<TokenLogprob> a, b;
      for (const GenerationEvent& e : s.events) a.insert(a.end(), e.logprobs.begin(), e.logprobs.end());
      for (const GenerationEvent& e : plain[r.id].events) b.insert(b.end(), e.logprobs.begin(), e.logprobs.end());
      ASSERT_EQ(a.size(), b.size()) << r.id;
      for (size_t t = 0; t < a.size(); ++t) {
        EXPECT_EQ(a[t].id, b[t].id) << r.id << " token " << t;
        EXPECT_NEAR(a[t].logprob, b[t].logprob, 1e-4) << r.id << " token " << t;
        ASSERT_EQ(a[t].top.size(), b[t].top.size());
      }
    }
    if (mode) {
      const GeneratorStats s = engine.stats();
      EXPECT_GT(s.spec_draft_tokens, 0u) << "mode " << mode;
      EXPECT_GT(s.spec_accepted_tokens, 0u) << "mode " << mode;
      if (mode == 2) {  // every request had guesses, a third of them wrong
        EXPECT_GT(s.spec_drafts, requests.size());
        EXPECT_LT(s.spec_accepted_tokens, s.spec_draft_tokens);
      }
    }
  }
}

}  // namespace
}  // namespace ossrt
