// EAGLE-3 drafting on the CPU oracle (issue 17): heads made here at random in the published format
// (config.json + safetensors: plain, with norm_before_fc, with a reduced vocabulary and d2t) load and
// draft exactly what an independent plain-loop computation of the head gives for the tiny model's
// captured hidden states; the capture takes the layers' outputs (checked against the model's own
// observations); greedy engine output with the eagle3 drafter equals plain decoding (batches where
// some sequences are followed and others not, chunked prefill, rollbacks across the 128-token window,
// preemption); and a head that does not fit the target is a clear error at load.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "eagle3_test_head.h"
#include "engine/eagle3_drafter.h"
#include "engine_test_model.h"
#include "model/eagle3_checkpoint.h"
#include "model/eagle3_head.h"
#include "runtime/model_runtime.h"

namespace ossrt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using namespace testing_engine;
using namespace testing_eagle3;

// ---------------------------------------------------------------- the head, by plain loops

// The EAGLE-3 head of SGLang's/vLLM's llama_eagle3.py written out with loops and double sums, over
// the values written above and the target's own embedding and unembedding where the head has none.
class ReferenceHead {
 public:
  ReferenceHead(const HeadSpec& s, const HeadValues& v, const HostModelWeights& target) : s_(s), v_(v), t_(target) {
    if (s.draft_vocab == 0) {  // the target's unembedding, as floats
      lm_head_.resize(size_t(target.lm_head.numel()));
      target.lm_head.to_f32(0, target.lm_head.numel(), lm_head_.data());
    }
  }

  struct Row {
    std::vector<float> prenorm, normed;
  };
  // Row at `pos` (rows come at positions 0, 1, 2, ... in order): hidden state `h` (3H of target
  // states when from_target, else the previous row's output), the token at pos + 1.
  Row row(std::vector<float> h, bool from_target, int32_t token, int pos) {
    const int H = s_.hidden, D = s_.head_dim, Hq = s_.heads, Hkv = s_.kv_heads;
    if (from_target) {
      if (s_.norm_before_fc) h = rms(h, w("input_norm.weight"));
      h = matvec(w("fc.weight"), H, h);
    }
    std::vector<float> e(static_cast<size_t>(H));
    if (s_.own_embed) {
      std::copy_n(w("embed_tokens.weight").data() + size_t(token) * size_t(H), H, e.data());
    } else {
      t_.embed.to_f32(int64_t(token) * H, H, e.data());
    }
    const std::string L = s_.layer_prefix;
    const std::vector<float> en = rms(e, w(L + "input_layernorm.weight")), hn = rms(h, w(L + "hidden_norm.weight"));
    std::vector<float> cat = en;
    cat.insert(cat.end(), hn.begin(), hn.end());
    std::vector<float> q = matvec(w(L + "self_attn.q_proj.weight"), Hq * D, cat);
    std::vector<float> k = matvec(w(L + "self_attn.k_proj.weight"), Hkv * D, cat);
    const std::vector<float> vv = matvec(w(L + "self_attn.v_proj.weight"), Hkv * D, cat);
    for (int head = 0; head < Hq; ++head) rope(q.data() + head * D, pos);
    for (int head = 0; head < Hkv; ++head) rope(k.data() + head * D, pos);
    EXPECT_EQ(int(keys_.size()), pos) << "reference rows must come in position order";
    keys_.push_back(k);
    values_.push_back(vv);
    std::vector<float> attn(size_t(Hq * D));
    for (int head = 0; head < Hq; ++head) {
      const int g = head / (Hq / Hkv);
      std::vector<double> score(size_t(pos + 1));
      double mx = -1e300;
      for (int j = 0; j <= pos; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[size_t(head * D + d)]) * keys_[size_t(j)][size_t(g * D + d)];
        score[size_t(j)] = dot / std::sqrt(double(D));
        mx = std::max(mx, score[size_t(j)]);
      }
      double den = 0;
      for (double& x : score) den += (x = std::exp(x - mx));
      for (int d = 0; d < D; ++d) {
        double acc = 0;
        for (int j = 0; j <= pos; ++j) acc += score[size_t(j)] * values_[size_t(j)][size_t(g * D + d)];
        attn[size_t(head * D + d)] = float(acc / den);
      }
    }
    std::vector<float> x = matvec(w(L + "self_attn.o_proj.weight"), H, attn);
    const std::vector<float>& residual = s_.norm_before_residual ? hn : h;
    for (int i = 0; i < H; ++i) x[size_t(i)] += residual[size_t(i)];
    const std::vector<float> m = rms(x, w(L + "post_attention_layernorm.weight"));
    const std::vector<float> gate = matvec(w(L + "mlp.gate_proj.weight"), s_.inter, m);
    const std::vector<float> up = matvec(w(L + "mlp.up_proj.weight"), s_.inter, m);
    std::vector<float> act(size_t(s_.inter));
    for (int i = 0; i < s_.inter; ++i)
      act[size_t(i)] = float(double(gate[size_t(i)]) / (1.0 + std::exp(-double(gate[size_t(i)]))) * up[size_t(i)]);
    const std::vector<float> down = matvec(w(L + "mlp.down_proj.weight"), H, act);
    for (int i = 0; i < H; ++i) x[size_t(i)] += down[size_t(i)];
    return Row{x, rms(x, w("norm.weight"))};
  }
  // The chain's next hidden state from a row.
  std::vector<float> next_hidden(const Row& r) const { return s_.norm_output ? r.normed : r.prenorm; }
  std::vector<float> logits(const Row& r) const {
    if (s_.draft_vocab > 0) return matvec(v_.t.at("lm_head.weight"), s_.draft_vocab, r.normed);
    return matvec(lm_head_, s_.vocab, r.normed);
  }
  int32_t target_id(const std::vector<float>& logits) const {
    const int32_t d = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    return v_.d2t.empty() ? d : v_.d2t[size_t(d)];
  }

 private:
  const std::vector<float>& w(const std::string& name) const { return v_.t.at(name); }
  std::vector<float> rms(const std::vector<float>& x, const std::vector<float>& g) const {
    double ss = 0;
    for (float a : x) ss += double(a) * a;
    const double inv = 1.0 / std::sqrt(ss / double(x.size()) + s_.eps);
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = float(double(x[i]) * inv * g[i]);
    return y;
  }
  static std::vector<float> matvec(const std::vector<float>& m, int out, const std::vector<float>& x) {
    const size_t in = x.size();
    EXPECT_EQ(m.size(), size_t(out) * in);
    std::vector<float> y(static_cast<size_t>(out));
    for (size_t r = 0; r < size_t(out); ++r) {
      double acc = 0;
      for (size_t c = 0; c < in; ++c) acc += double(m[r * in + c]) * x[c];
      y[r] = float(acc);
    }
    return y;
  }
  // Half-split (NeoX / HF rotate_half) RoPE with inv_freq = theta^(-2i/D).
  void rope(float* x, int pos) const {
    const int D = s_.head_dim, half = D / 2;
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(s_.rope_theta, -2.0 * i / D);
      const double a = x[i], b = x[i + half];
      x[i] = float(a * std::cos(angle) - b * std::sin(angle));
      x[i + half] = float(b * std::cos(angle) + a * std::sin(angle));
    }
  }

  HeadSpec s_;
  const HeadValues& v_;
  const HostModelWeights& t_;
  std::vector<float> lm_head_;
  std::vector<std::vector<float>> keys_, values_;
};

// ---------------------------------------------------------------- the tiny target

struct TinyTarget {
  explicit TinyTarget(int max_step_tokens = 256, int max_logit_rows = 32)
      : weights(make_dummy_weights(preset_config("tiny"), 3)),
        backend(make_cpu_backend(BackendOptions{.threads = 2})),
        model(*backend, weights, ModelLimits{max_step_tokens, max_logit_rows}) {}
  HostModelWeights weights;
  std::unique_ptr<Backend> backend;
  GptOssModel model;
};

TinyTarget& shared_target() {
  static TinyTarget* t = new TinyTarget();
  return *t;
}

std::vector<float> host(Backend& b, const Tensor& t) { return b.to_host_f32(t); }

// ---------------------------------------------------------------- capture

TEST(Eagle3Capture, TakesEachListedLayersOutput) {
  TinyTarget target;  // its own: the observer syncs every op
  GptOssModel& m = target.model;
  const int L = m.config().num_layers, H = m.config().hidden_size;
  std::map<std::string, std::vector<float>> seen;
  m.set_observer([&](const std::string& name, const Tensor& t) { seen[name] = target.backend->to_host_f32(t); });
  m.set_capture_layers({3, 0, 2});  // any order: captured(i) is layer capture_layers()[i]
  const std::vector<int32_t> prompt = random_prompt(37, 11, 200000);
  SingleSequenceRunner runner(m, 64);
  runner.run(prompt, 0, SingleSequenceRunner::Logits::LastRow);

  // The residual stream after layer l, rebuilt from the model's own observations in its order:
  // x = embed, then per layer x += attention output, x += MoE output.
  std::vector<std::vector<float>> after(static_cast<size_t>(L));
  std::vector<float> x = seen.at("embed");
  for (int l = 0; l < L; ++l) {
    for (const char* part : {"attn_out", "moe_out"}) {
      const std::vector<float>& d = seen.at(fmt::format("layer{}.{}", l, part));
      ASSERT_EQ(d.size(), x.size());
      for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
    }
    after[size_t(l)] = x;
  }
  EXPECT_EQ(after[size_t(L - 1)], seen.at("residual"));  // the rebuild is the model's own stream
  for (size_t i = 0; i < m.capture_layers().size(); ++i) {
    const int layer = m.capture_layers()[i];
    const std::vector<float> got = host(*target.backend, m.captured(i));
    ASSERT_EQ(got.size(), size_t(prompt.size()) * size_t(H));
    EXPECT_EQ(got, after[size_t(layer)]) << "capture " << i << " should be layer " << layer << "'s output";
    // ...and not its input (the boundary engines got wrong): layer l's output differs from l - 1's.
    if (layer > 0) {
      EXPECT_NE(got, after[size_t(layer - 1)]);
    }
  }
  EXPECT_THROW(m.set_capture_layers({4}), Error);
  EXPECT_THROW(m.set_capture_layers({1, 1}), Error);
}

// ---------------------------------------------------------------- load and first drafts

struct Variant {
  std::string name;
  HeadSpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  out.push_back({"plain", HeadSpec{}});
  HeadSpec fc;
  fc.norm_before_fc = true;
  fc.nested_flags = true;  // NVIDIA's layout: the flags inside eagle_config
  fc.aux = {1, 2, 3};
  fc.seed = 2;
  out.push_back({"norm_before_fc", fc});
  HeadSpec reduced;
  reduced.draft_vocab = 64;
  for (int d = 0; d < 64; ++d) reduced.draft_targets.push_back(int32_t(1000 + 3 * d + (d * d) % 5));
  reduced.own_embed = false;
  reduced.norm_before_residual = true;
  reduced.norm_output = true;
  reduced.layer_prefix = "layers.0.";
  reduced.aux = {0, 1};  // two captured layers: fc is [H, 2 H]
  reduced.seed = 3;
  out.push_back({"reduced_vocab_d2t", reduced});
  return out;
}

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class Eagle3HeadTest : public ::testing::TestWithParam<Variant> {};

TEST_P(Eagle3HeadTest, DraftsWhatAPlainLoopHeadComputes) {
  const HeadSpec& spec = GetParam().spec;
  TinyTarget& target = shared_target();
  TempDir dir;
  const HeadValues values = write_head(dir.path(), spec);
  const Eagle3HostWeights hw = load_eagle3_head(dir.path().string(), target.weights);
  EXPECT_EQ(hw.config.aux_layers, spec.aux);
  EXPECT_EQ(hw.config.norm_before_fc, spec.norm_before_fc);
  EXPECT_EQ(hw.config.draft_vocab_size, spec.draft_vocab > 0 ? spec.draft_vocab : spec.vocab);
  std::unique_ptr<Backend> head_backend = make_cpu_backend(BackendOptions{.threads = 2});
  Eagle3Head head(*head_backend, hw, 256, 4);
  const int k = 4;
  Eagle3Drafter drafter(target.model, head, k, /*max_model_len=*/512, /*max_seqs=*/4);

  // The target runs a prompt; its sampled token follows (any token does for the head).
  std::vector<int32_t> tokens = random_prompt(45, 21, 200000);
  const int n = int(tokens.size());
  SingleSequenceRunner runner(target.model, 128);
  std::vector<float> logits = runner.run(tokens, 0, SingleSequenceRunner::Logits::LastRow);
  tokens.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  std::vector<std::vector<float>> captured;
  for (size_t i = 0; i < spec.aux.size(); ++i) captured.push_back(host(*target.backend, target.model.captured(i)));

  const StepRows rows{7, 0, 0, n, tokens};
  drafter.observe_step(std::span<const StepRows>(&rows, 1));
  DraftRequest request;
  request.sequence = 7;
  request.tokens = tokens;
  request.max_tokens = k;
  const Draft draft = drafter.propose(request);
  ASSERT_EQ(int(draft.tokens.size()), k);
  EXPECT_TRUE(draft.probs.empty());
  EXPECT_EQ(drafter.head_rows_run(), n + k - 1);

  // The reference: every prompt row from the captured states, then the chain.
  ReferenceHead ref(spec, values, target.weights);
  ReferenceHead::Row last;
  const int H = 128;
  for (int p = 0; p < n; ++p) {
    std::vector<float> states;
    for (const auto& c : captured) states.insert(states.end(), c.begin() + p * H, c.begin() + (p + 1) * H);
    last = ref.row(states, true, tokens[size_t(p + 1)], p);
  }
  std::vector<int32_t> expected;
  std::vector<float> ref_logits = ref.logits(last);
  expected.push_back(ref.target_id(ref_logits));
  for (int j = 1; j < k; ++j) {
    last = ref.row(ref.next_hidden(last), false, expected.back(), n - 1 + j);
    ref_logits = ref.logits(last);
    expected.push_back(ref.target_id(ref_logits));
  }
  EXPECT_EQ(draft.tokens, expected);
  // The last chain step's logits themselves, not only their argmax.
  const std::vector<float> got = head.last_logits();
  ASSERT_EQ(got.size(), ref_logits.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(double(got[i]) - ref_logits[i]) / (1.0 + std::fabs(double(ref_logits[i]))));
  EXPECT_LT(worst, 2e-4);
  for (int32_t t : draft.tokens) {
    if (spec.draft_vocab > 0) {
      EXPECT_NE(std::find(spec.draft_targets.begin(), spec.draft_targets.end(), t), spec.draft_targets.end());
    }
  }

  // The draft is for these tokens only; another sequence, or the same one grown, gets nothing.
  request.sequence = 8;
  EXPECT_TRUE(drafter.propose(request).tokens.empty());
  request.sequence = 7;
  const std::vector<int32_t> grown(tokens.begin(), tokens.end() - 1);
  request.tokens = grown;
  EXPECT_TRUE(drafter.propose(request).tokens.empty());
  EXPECT_EQ(drafter.followed(), 1);
  drafter.finished(7, tokens, n);
  EXPECT_EQ(drafter.followed(), 0);
}

INSTANTIATE_TEST_SUITE_P(Heads, Eagle3HeadTest, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- heads that do not fit

std::string load_error(const HeadSpec& spec) {
  TempDir dir;
  write_head(dir.path(), spec);
  try {
    load_eagle3_head(dir.path().string(), shared_target().weights);
  } catch (const Error& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(Eagle3Load, RefusesHeadsThatDoNotFitTheTarget) {
  {
    HeadSpec s;  // a head for a wider model: its states and embedding would not fit
    s.hidden = 96;
    s.extra["target_hidden_size"] = 96;
    EXPECT_THAT(load_error(s), HasSubstr("target's hidden size is 128"));
  }
  {
    HeadSpec s;  // its own width, without an embedding of its own: nothing to embed tokens with
    s.hidden = 96;
    s.extra["target_hidden_size"] = 128;
    EXPECT_THAT(load_error(s), HasSubstr("no embed_tokens.weight"));
  }
  {
    HeadSpec s;
    s.omit = {"midlayer.mlp.down_proj.weight"};
    EXPECT_THAT(load_error(s), HasSubstr("midlayer.mlp.down_proj.weight not found"));
  }
  {
    HeadSpec s;
    s.aux = {0, 2, 4};  // the tiny target has layers 0..3
    EXPECT_THAT(load_error(s), HasSubstr("layer 4 is out of range for a target of 4 layers"));
  }
  {
    HeadSpec s;  // fc written for 3 states, config lists 2
    s.aux = {0, 2, 3};
    s.extra["eagle_aux_hidden_state_layer_ids"] = {0, 2};
    EXPECT_THAT(load_error(s), HasSubstr("fc.weight has shape [128, 384], expected [128, 256]"));
  }
  {
    HeadSpec s;
    s.draft_vocab = 8;
    for (int d = 0; d < 8; ++d) s.draft_targets.push_back(d * 2);
    s.omit = {"d2t"};
    EXPECT_THAT(load_error(s), HasSubstr("d2t not found"));
    s.omit = {};
    s.draft_targets[5] = 201088;  // past the vocabulary
    EXPECT_THAT(load_error(s), HasSubstr("draft id 5 maps to target id 201088 outside the vocabulary"));
  }
  {
    HeadSpec s;
    s.extra["vocab_size"] = 1000;
    EXPECT_THAT(load_error(s), HasSubstr("vocab_size 1000 differs from the target's 201088"));
  }
  {
    HeadSpec s;
    s.extra["num_hidden_layers"] = 2;
    EXPECT_THAT(load_error(s), HasSubstr("num_hidden_layers must be 1"));
    s.extra = {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
    EXPECT_THAT(load_error(s), HasSubstr("type 'yarn' is not supported"));
  }
  EXPECT_THROW(parse_speculative_config(R"({"method": "eagle3", "num_speculative_tokens": 3})"), Error);
  const SpeculativeConfig c =
      parse_speculative_config(R"({"method": "eagle3", "model": "/heads/x", "num_speculative_tokens": 3})");
  EXPECT_EQ(c.method, "eagle3");
  EXPECT_EQ(c.draft_model, "/heads/x");
  EXPECT_THROW(make_drafter(c), Error);  // the runtime loads it
}

// ---------------------------------------------------------------- the engine

// Prompts of 20 to 140 tokens, up to 40 out: sequences that cross the 128-token window while they
// draft, so rejected guesses roll back across window blocks.
std::vector<Case> engine_cases() {
  std::vector<Case> out;
  const int lens[] = {20, 96, 118, 140, 60, 125};
  for (int i = 0; i < 6; ++i)
    out.push_back({"e" + std::to_string(i), random_prompt(lens[i], 300 + uint32_t(i), 200000), 24 + (i * 5) % 17});
  return out;
}

class Eagle3EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new TinyTarget(256, 6 * 5);  // 6 sequences, up to 4 guesses each
    reference_ = new TinyTarget();
    // A head whose draft vocabulary is the tokens the references produce most: its guesses are
    // sometimes right (accepted) and often wrong (rolled back).
    std::map<int32_t, int> freq;
    for (const Case& c : engine_cases())
      for (int32_t t : reference(c)) ++freq[t];
    std::vector<std::pair<int, int32_t>> by_count;
    for (const auto& [t, n] : freq) by_count.push_back({-n, t});
    std::sort(by_count.begin(), by_count.end());
    spec_.draft_vocab = std::min<int>(4, int(by_count.size()));
    for (int d = 0; d < spec_.draft_vocab; ++d) spec_.draft_targets.push_back(by_count[size_t(d)].second);
    spec_.seed = 9;
    dir_ = new TempDir();
    write_head(dir_->path(), spec_);
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_;
    delete dir_;
  }

  static const std::vector<int32_t>& reference(const Case& c) {
    static std::map<std::string, std::vector<int32_t>> memo;
    auto it = memo.find(c.id);
    if (it == memo.end()) it = memo.emplace(c.id, reference_greedy(reference_->model, c.prompt, c.max_tokens)).first;
    return it->second;
  }

  struct Run {
    GeneratorStats stats;
    int64_t head_rows = 0, unfollowed = 0;
    int followed_after = -1;
    int checked = 0;
  };
  // Passes the engine's calls to the drafter under test and checks every draft it hands out against
  // a fresh drafter that sees the sequence's whole prefix at once (a new target forward from
  // position 0, then its first chain): whatever the engine's steps, rollbacks and chunks did, the
  // head's cache must hold what a clean run computes.
  class CheckingDrafter : public Drafter {
   public:
    CheckingDrafter(std::shared_ptr<Eagle3Drafter> real, Eagle3Drafter& fresh)
        : real_(std::move(real)), fresh_(fresh) {}
    Draft propose(const DraftRequest& r) override {
      Draft d = real_->propose(r);
      if (d.tokens.empty()) return d;
      ++checked;
      fresh_.finished(last_, {}, 0);  // its one slot, for this sequence
      last_ = r.sequence;
      SingleSequenceRunner runner(reference_->model, int(r.tokens.size()));
      runner.run(r.tokens.first(r.tokens.size() - 1), 0, SingleSequenceRunner::Logits::LastRow);
      const StepRows rows{r.sequence, 0, 0, int(r.tokens.size()) - 1, r.tokens};
      fresh_.observe_step(std::span<const StepRows>(&rows, 1));
      EXPECT_EQ(d.tokens, fresh_.propose(r).tokens) << "sequence " << r.sequence << " at " << r.tokens.size();
      return d;
    }
    void observe_step(std::span<const StepRows> rows) override { real_->observe_step(rows); }
    void finished(uint64_t id, std::span<const int32_t> tokens, int prompt_len) override {
      real_->finished(id, tokens, prompt_len);
    }
    int checked = 0;

   private:
    std::shared_ptr<Eagle3Drafter> real_;
    Eagle3Drafter& fresh_;
    uint64_t last_ = 0;
  };

  // Runs every case together with the eagle3 drafter following up to `followed` sequences at once.
  static Run run(int k, int followed, int budget, int num_full_blocks, bool check = false) {
    const Eagle3HostWeights hw = load_eagle3_head(dir_->path().string(), model_->weights);
    std::unique_ptr<Backend> head_backend = make_cpu_backend(BackendOptions{.threads = 2});
    Eagle3Head head(*head_backend, hw, 256, followed);
    auto eagle = std::make_shared<Eagle3Drafter>(model_->model, head, k, 512, followed);
    std::shared_ptr<Drafter> drafter = eagle;
    std::unique_ptr<Backend> fresh_backend;
    std::unique_ptr<Eagle3Head> fresh_head;
    std::unique_ptr<Eagle3Drafter> fresh;
    std::shared_ptr<CheckingDrafter> checking;
    if (check) {
      fresh_backend = make_cpu_backend(BackendOptions{.threads = 2});
      fresh_head = std::make_unique<Eagle3Head>(*fresh_backend, hw, 256, 1);
      fresh = std::make_unique<Eagle3Drafter>(reference_->model, *fresh_head, k, 512, 1);
      drafter = checking = std::make_shared<CheckingDrafter>(eagle, *fresh);
    }
    EngineConfig c;
    c.max_num_seqs = 6;
    c.max_num_batched_tokens = budget;
    c.block_size = 16;
    c.num_full_blocks = num_full_blocks;
    c.enable_prefix_caching = false;
    c.start_thread = false;
    c.speculative.method = "eagle3";
    c.speculative.draft_model = dir_->path().string();
    c.speculative.num_speculative_tokens = k;
    c.drafter = drafter;
    Run r;
    {
      Engine engine(model_->model, c);
      EventLog log;
      const std::vector<Case> all = engine_cases();
      for (const Case& cs : all)
        EXPECT_TRUE(engine.submit(greedy_request(cs.id, cs.prompt, cs.max_tokens), log.callback(cs.id)));
      engine.run_until_idle();
      for (const Case& cs : all) {
        const EventLog::Stream s = log.get(cs.id);
        EXPECT_TRUE(s.finished) << cs.id;
        EXPECT_EQ(s.tokens, reference(cs)) << cs.id;
      }
      EXPECT_EQ(engine.kv_cache().num_sequences(), 0);
      r.stats = engine.stats();
    }
    r.head_rows = eagle->head_rows_run();
    r.unfollowed = eagle->sequences_unfollowed();
    r.followed_after = eagle->followed();
    if (checking) r.checked = checking->checked;
    if (fresh) reference_->model.set_capture_layers({});
    return r;
  }

  static TinyTarget* model_;
  static TinyTarget* reference_;
  static TempDir* dir_;
  static HeadSpec spec_;
};

TinyTarget* Eagle3EngineTest::model_ = nullptr;
TinyTarget* Eagle3EngineTest::reference_ = nullptr;
TempDir* Eagle3EngineTest::dir_ = nullptr;
HeadSpec Eagle3EngineTest::spec_;

TEST_F(Eagle3EngineTest, GreedyOutputIsPlainDecodingsWithSomeSequencesUnfollowed) {
  // 6 sequences, the head follows 4 (the other 2 decode without guesses); 64-token steps chunk
  // the prompts, so the head sees each prompt over several steps.
  const Run r = run(/*k=*/3, /*followed=*/4, /*budget=*/64, /*num_full_blocks=*/256);
  EXPECT_GT(r.stats.spec_drafts, 0u);
  EXPECT_GT(r.stats.spec_accepted_tokens, 0u);                         // some guesses right...
  EXPECT_LT(r.stats.spec_accepted_tokens, r.stats.spec_draft_tokens);  // ...and some rolled back
  EXPECT_GT(r.stats.spec_mean_acceptance_length(), 1.0);
  EXPECT_GT(r.head_rows, 0);
  EXPECT_GT(r.unfollowed, 0);      // sequences that found no free slot decoded plainly
  EXPECT_EQ(r.followed_after, 0);  // every slot came back
}

TEST_F(Eagle3EngineTest, EveryDraftIsWhatAFreshRunOfTheHeadGives) {
  const Run r = run(/*k=*/3, /*followed=*/6, /*budget=*/64, /*num_full_blocks=*/256, /*check=*/true);
  EXPECT_GT(r.checked, 20);
  EXPECT_GT(r.stats.spec_accepted_tokens, 0u);
  EXPECT_EQ(r.unfollowed, 0);
}

TEST_F(Eagle3EngineTest, PreemptionRestartsTheHeadsRowsAndKeepsTheOutput) {
  // 20 blocks of 16 tokens for 6 sequences of up to 180: preemptions recompute from position 0.
  const Run r = run(/*k=*/4, /*followed=*/6, /*budget=*/48, /*num_full_blocks=*/20);
  EXPECT_GT(r.stats.preemptions, 0u);
  EXPECT_GT(r.stats.spec_accepted_tokens, 0u);
  EXPECT_EQ(r.followed_after, 0);
}

// ---------------------------------------------------------------- the runtime

TEST(Eagle3Runtime, LoadsTheHeadFromSpeculativeConfig) {
  TempDir dir;
  write_head(dir.path(), HeadSpec{});
  RuntimeOptions o = tiny_runtime_with_head(dir.path());
  o.threads = 2;
  std::unique_ptr<ModelRuntime> rt = ModelRuntime::build(o);
  EXPECT_FALSE(rt->engine().config().enable_prefix_caching);  // the head needs every prompt row
  const std::vector<int32_t> prompt = random_prompt(30, 5, 200000);
  EventLog log;
  rt->engine().submit(greedy_request("r", prompt, 8), log.callback("r"));
  rt->engine().drain(std::chrono::seconds(60));
  EXPECT_EQ(log.get("r").tokens, reference_greedy(shared_target().model, prompt, 8));
  EXPECT_GT(rt->engine().stats().spec_drafts, 0u);

  RuntimeOptions cuda = o;  // CUDA is allowed (tests/kernels/eagle3_cuda_test.cpp), more than one rank is not
  cuda.backend = "cuda";
  EXPECT_NO_THROW(cuda.validate());
  RuntimeOptions tp = o;
  tp.parallel.tensor_parallel = 2;
  EXPECT_THROW(tp.validate(), Error);
}

}  // namespace
}  // namespace ossrt
