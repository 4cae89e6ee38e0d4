// The engine's token-constraint hook, on the small dummy-weight model (vocab 512): constrained
// greedy requests, batched with unconstrained ones and chunked, must produce exactly the argmax
// over the allowed tokens of an independent reference (single-sequence forward + a separate
// matcher's brute-force mask), end with the end token once the grammar is complete, and leave
// their neighbours' outputs untouched; plus the sampler's mask rules and the error paths.
#include <gtest/gtest.h>

#include <limits>

#include "engine/drafter.h"
#include "engine/step_sampling.h"
#include "engine_test_model.h"
#include "sampling/logits_processing.h"
#include "sampling/sampler.h"
#include "structured/ebnf.h"
#include "structured/harmony_constraint.h"
#include "structured_test_util.h"

namespace ossrt {
namespace {

using namespace testing_engine;
using structured::CompiledGrammar;
using structured::GrammarConstraint;
using structured::GrammarMatcher;

constexpr int32_t kEos = 511;

// 512 ids like the small model: 256 bytes, random strings, and the last three special (511 = EOS).
std::shared_ptr<const structured::Vocabulary> vocab512() {
  static auto v = structured::testing::synthetic_vocab("abc0123456789,;", 512 - 256 - 3, 4, 77, 3);
  return v;
}

std::shared_ptr<const CompiledGrammar> grammar() {
  static auto g =
      std::make_shared<const CompiledGrammar>(structured::parse_ebnf(R"(root ::= [a-c]{2,6} ("," num){0,3} ";"
                                num ::= [1-9] [0-9]{0,2})"),
                                              vocab512());
  return g;
}

EngineConfig engine_config(int budget) {
  EngineConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = budget;
  c.num_full_blocks = 256;
  c.start_thread = false;
  return c;
}

// Greedy under the grammar, computed independently: plain forwards, a separate matcher, and the
// brute-force mask (every token tried on a copy), argmax with the lowest id on ties.
std::vector<int32_t> reference_constrained(GptOssModel& model, const std::vector<int32_t>& prompt, int max_tokens) {
  SingleSequenceRunner runner(model, int(prompt.size()) + max_tokens);
  std::vector<float> logits = runner.run(prompt, 0, SingleSequenceRunner::Logits::LastRow);
  GrammarMatcher m(grammar());
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    std::vector<uint32_t> mask = structured::testing::brute_force_mask(m);
    if (m.can_end()) structured::set_bit(mask, kEos);
    int32_t best = -1;
    for (int32_t id = 0; id < 512; ++id)
      if (structured::test_bit(mask, id) && (best < 0 || logits[size_t(id)] > logits[size_t(best)])) best = id;
    out.push_back(best);
    if (best == kEos) break;
    EXPECT_TRUE(m.accept_token(best));
    logits = runner.run(std::vector<int32_t>{best}, 1, SingleSequenceRunner::Logits::LastRow);
  }
  return out;
}

TEST(EngineConstraint, ConstrainedGreedyEqualsTheMaskedReferenceInABatch) {
  SmallModel model;
  SmallModel reference;
  Engine engine(model.model, engine_config(/*budget=*/23));  // small budget: prompts are chunked
  EventLog log;
  const int n = 10;
  for (int i = 0; i < n; ++i) {
    const std::string id = "r" + std::to_string(i);
    GenerationRequest r = greedy_request(id, random_prompt(3 + (i * 29) % 40, 300 + uint32_t(i)), 40);
    r.sampling.ignore_eos = false;
    if (i % 2 == 0) r.constraint = std::make_shared<GrammarConstraint>(grammar(), std::vector<int32_t>{kEos});
    ASSERT_TRUE(engine.submit(std::move(r), log.callback(id)));
  }
  engine.run_until_idle();
  int constrained_tokens = 0;
  for (int i = 0; i < n; ++i) {
    const std::string id = "r" + std::to_string(i);
    const auto s = log.get(id);
    const auto prompt = random_prompt(3 + (i * 29) % 40, 300 + uint32_t(i));
    ASSERT_TRUE(s.finished);
    if (i % 2 == 0) {
      auto expected = reference_constrained(reference.model, prompt, 40);
      ASSERT_EQ(expected.back(), kEos) << "the grammar is bounded: the reference must end";
      EXPECT_EQ(s.final_event.finish_reason, FinishReason::Stop) << id;
      EXPECT_EQ(s.final_event.stop_token, std::optional<int32_t>(kEos));
      expected.pop_back();  // the stop token is not streamed
      EXPECT_EQ(s.tokens, expected) << id;
      std::string text;
      for (int32_t t : s.tokens) text += vocab512()->bytes(t);
      GrammarMatcher m(grammar());
      EXPECT_TRUE(m.accept_bytes(text) && m.can_end()) << text;
      constrained_tokens += int(s.tokens.size()) + 1;
    } else {
      // Neighbours are untouched (greedy until EOS or 40 tokens).
      auto ref = reference_greedy(reference.model, prompt, 40);
      auto eos = std::find(ref.begin(), ref.end(), kEos);
      ref.erase(eos, ref.end());
      EXPECT_EQ(s.tokens, ref) << id;
    }
  }
  EXPECT_GT(constrained_tokens, 20);
}

// Speculative decoding on constrained requests: a drafter that guesses the constrained reference
// continuation, with every third draft going wrong from its second guess (a token the grammar
// refuses half the time, an allowed but wrong one otherwise). Every verify row is masked by the
// grammar advanced through the guesses before it, so the output must still be the reference's,
// guesses must be accepted, and the grammar's state must follow only the emitted tokens.
class ConstrainedReplay final : public Drafter {
 public:
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> known;
  int drafts = 0;
  Draft propose(const DraftRequest& r) override {
    for (const auto& [prompt, cont] : known) {
      if (r.tokens.size() < prompt.size() || !std::equal(prompt.begin(), prompt.end(), r.tokens.begin())) continue;
      const size_t done = r.tokens.size() - prompt.size();
      if (done >= cont.size() ||
          !std::equal(r.tokens.begin() + std::ptrdiff_t(prompt.size()), r.tokens.end(), cont.begin()))
        continue;
      const int n = drafts++;
      std::vector<int32_t> out;
      for (size_t i = done; i < cont.size() && int(out.size()) < r.max_tokens; ++i) {
        int32_t g = cont[i];
        if (n % 3 == 2 && out.size() >= 1) g = n % 2 ? 0 : (g == 'a' ? 'b' : 'a');  // 0 (NUL): never allowed
        out.push_back(g);
      }
      return Draft{out, {}};
    }
    return {};
  }
};

TEST(EngineConstraint, ConstrainedRequestsSpeculateAndKeepTheReferenceOutput) {
  SmallModel model(256, 64);  // logit rows for 8 sequences and their guesses
  SmallModel reference;
  EngineConfig c = engine_config(/*budget=*/48);
  c.speculative.method = "ngram";
  c.speculative.num_speculative_tokens = 3;
  auto drafter = std::make_shared<ConstrainedReplay>();
  c.drafter = drafter;
  std::vector<std::vector<int32_t>> prompts, expected;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(random_prompt(4 + (i * 17) % 30, 900 + uint32_t(i)));
    expected.push_back(reference_constrained(reference.model, prompts.back(), 40));
    ASSERT_EQ(expected.back().back(), kEos);
    drafter->known.push_back({prompts.back(), expected.back()});
  }
  Engine engine(model.model, c);
  EventLog log;
  std::vector<std::shared_ptr<GrammarConstraint>> constraints;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "c" + std::to_string(i);
    GenerationRequest r = greedy_request(id, prompts[size_t(i)], 40);
    r.sampling.ignore_eos = false;
    constraints.push_back(std::make_shared<GrammarConstraint>(grammar(), std::vector<int32_t>{kEos}));
    r.constraint = constraints.back();
    ASSERT_TRUE(engine.submit(std::move(r), log.callback(id)));
  }
  engine.run_until_idle();
  for (int i = 0; i < 6; ++i) {
    const std::string id = "c" + std::to_string(i);
    const auto s = log.get(id);
    ASSERT_TRUE(s.finished) << id;
    EXPECT_EQ(s.final_event.finish_reason, FinishReason::Stop) << id << " " << s.final_event.error;
    std::vector<int32_t> want = expected[size_t(i)];
    want.pop_back();  // the stop token is not streamed
    EXPECT_EQ(s.tokens, want) << id;
  }
  const GeneratorStats st = engine.stats();
  EXPECT_GT(st.spec_draft_tokens, 0u);
  EXPECT_GT(st.spec_accepted_tokens, 0u);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);  // the wrong guesses were rejected
  EXPECT_GT(drafter->drafts, 6);
}

// A constraint that allows one fixed token, then rejects what it is given.
class Stubborn final : public TokenConstraint {
 public:
  int32_t vocab_size() const override { return vocab; }
  bool fill_mask(std::span<uint32_t> mask) override {
    if (throw_in_mask) throw std::runtime_error("mask failure");
    mask[0] = 1u << 7;  // token 7 only
    return true;
  }
  bool accept(int32_t token) override { return ++accepted <= allow; }
  void rollback(int) override {}
  int32_t vocab = 512;
  int allow = 1000;
  int accepted = 0;
  bool throw_in_mask = false;
};

TEST(EngineConstraint, TheMaskDecidesAndErrorsEndOnlyTheirRequest) {
  SmallModel model;
  Engine engine(model.model, engine_config(64));
  EventLog log;
  auto forced = std::make_shared<Stubborn>();
  auto rejecting = std::make_shared<Stubborn>();
  rejecting->allow = 2;
  auto throwing = std::make_shared<Stubborn>();
  throwing->throw_in_mask = true;
  auto wrong_vocab = std::make_shared<Stubborn>();
  wrong_vocab->vocab = 1000;
  const std::pair<const char*, std::shared_ptr<Stubborn>> cases[] = {{"forced", forced},
                                                                     {"rejecting", rejecting},
                                                                     {"throwing", throwing},
                                                                     {"wrong_vocab", wrong_vocab},
                                                                     {"plain", nullptr}};
  for (const auto& [id, c] : cases) {
    GenerationRequest r = greedy_request(id, random_prompt(5, 9), 6);
    r.sampling.temperature = 1.0f;  // sampled: the mask must still decide
    r.sampling.seed = 3;
    r.constraint = c;
    ASSERT_TRUE(engine.submit(std::move(r), log.callback(id)));
  }
  engine.run_until_idle();
  EXPECT_EQ(log.get("forced").tokens, std::vector<int32_t>(6, 7));
  EXPECT_EQ(log.get("forced").final_event.finish_reason, FinishReason::Length);
  EXPECT_EQ(log.get("rejecting").tokens, std::vector<int32_t>(2, 7));
  EXPECT_EQ(log.get("rejecting").final_event.finish_reason, FinishReason::Error);
  EXPECT_NE(log.get("throwing").final_event.error.find("mask failure"), std::string::npos);
  EXPECT_EQ(log.get("throwing").final_event.finish_reason, FinishReason::Error);
  EXPECT_NE(log.get("wrong_vocab").final_event.error.find("covers 1000 tokens"), std::string::npos);
  EXPECT_EQ(log.get("plain").tokens.size(), 6u);
  EXPECT_EQ(log.get("plain").final_event.finish_reason, FinishReason::Length);
}

TEST(EngineConstraint, MaskedRowsGoToTheDeviceSamplerWithTheirMask) {
  SamplingParams p;
  p.temperature = 0.0f;
  SamplingState st(1, {}, p);
  std::vector<uint32_t> mask(16, 0xFFFFFFFFu);
  SamplingRow row{&p, &st, {}, {}, {}};
  ASSERT_TRUE(device_sampling_row(row).has_value());
  EXPECT_TRUE(device_sampling_row(row)->allowed.empty());
  row.allowed = mask;
  const auto d = device_sampling_row(row);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->allowed.data(), mask.data());
  EXPECT_EQ(d->allowed.size(), mask.size());
}

TEST(SamplerConstraint, MaskWinsOverMinTokensAndOverEverythingMasked) {
  const int64_t vocab = 64;
  std::vector<float> logits(size_t(vocab), 0.0f);
  logits[10] = 5.0f;  // the unconstrained favourite
  logits[20] = 1.0f;
  logits[63] = -1.0f;  // the EOS
  std::vector<uint32_t> mask(2, 0);
  mask[20 / 32] |= 1u << (20 % 32);
  mask[63 / 32] |= 1u << (63 % 32);
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 5;
  SamplingState st(1, {}, p);
  const std::vector<int32_t> eos = {63};
  Sampler s;
  // Below min_tokens the EOS is suppressed while something else is allowed...
  EXPECT_EQ(s.sample_row(logits, SamplingRow{&p, &st, eos, mask, {}}).id, 20);
  // ...but when the constraint allows only the EOS (a finished grammar), the EOS it is.
  mask[0] = 0;
  EXPECT_EQ(s.sample_row(logits, SamplingRow{&p, &st, eos, mask, {}}).id, 63);
  // NaN logits everywhere: the fallback stays inside the mask.
  std::vector<float> nan(size_t(vocab), std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(s.sample_row(nan, SamplingRow{&p, &st, {}, mask, {}}).id, 63);
  // Sampled rows draw only allowed ids.
  p.temperature = 1.0f;
  p.min_tokens = 0;
  mask[0] = (1u << 3) | (1u << 4);
  mask[1] = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingState sst(seed, {}, p);
    const int32_t id = s.sample_row(logits, SamplingRow{&p, &sst, {}, mask, {}}).id;
    EXPECT_TRUE(id == 3 || id == 4) << id;
  }
}

TEST(SamplerConstraint, ApplyAllowedMaskHandlesPartialWords) {
  std::vector<float> logits(40, 1.0f);
  std::vector<uint32_t> mask = {0x80000001u, 0x00000081u};  // ids 0, 31, 32, 39
  apply_allowed_mask(logits, mask);
  for (int i = 0; i < 40; ++i)
    EXPECT_EQ(std::isfinite(logits[size_t(i)]), i == 0 || i == 31 || i == 32 || i == 39) << i;
  EXPECT_EQ(argmax_allowed(std::vector<float>(40, 2.0f), mask), 0);
  EXPECT_TRUE(allows_other_than(mask, 40, std::vector<int32_t>{0, 31}));
  EXPECT_FALSE(allows_other_than(mask, 40, std::vector<int32_t>{0, 31, 32, 39}));
}

}  // namespace
}  // namespace ossrt
