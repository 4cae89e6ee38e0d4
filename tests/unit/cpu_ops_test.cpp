// Each CPU backend op against a direct formula written here in double precision (docs/reference/SPEC.md section 2).
// The references share no code with src/backend/cpu: they loop over the obvious indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "config/gpt_oss_config.h"
#include "core/error.h"
#include "model/gpt_oss.h"

namespace ossrt {
namespace {

std::vector<float> random_vector(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Largest |a - b| relative to the largest |b|.
double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, ref = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return diff / ref;
}

class CpuOpsTest : public ::testing::Test {
 protected:
  CpuOpsTest() : backend_(make_cpu_backend(BackendOptions{.threads = 2})) {}

  Tensor tensor(const std::vector<float>& values, std::initializer_list<int64_t> shape) {
    Tensor t = backend_->alloc(DType::F32, shape);
    EXPECT_EQ(size_t(t.numel()), values.size());
    backend_->from_host(t, values.data());
    return t;
  }
  std::vector<float> host(const Tensor& t) { return backend_->to_host_f32(t); }

  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_{1234};
};

TEST_F(CpuOpsTest, LinearMatchesDirectSum) {
  const int64_t T = 21, in = 45, out = 70;  // not multiples of the kernel's tiles or of 8
  auto x = random_vector(rng_, T * in), w = random_vector(rng_, out * in), b = random_vector(rng_, out);
  Tensor tx = tensor(x, {T, in}), tw = tensor(w, {out, in}), tb = tensor(b, {out});
  Tensor y = backend_->alloc(DType::F32, {T, out}), y_nobias = backend_->alloc(DType::F32, {T, out});
  backend_->linear(tx, tw, &tb, y);
  backend_->linear(tx, tw, nullptr, y_nobias);
  std::vector<double> ref(T * out), ref_nobias(T * out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
      ref_nobias[t * out + o] = s;
      ref[t * out + o] = s + b[o];
    }
  EXPECT_LT(max_rel_diff(host(y), ref), 1e-6);
  EXPECT_LT(max_rel_diff(host(y_nobias), ref_nobias), 1e-6);

  Tensor wrong = backend_->alloc(DType::F32, {T, out + 1});
  EXPECT_THROW(backend_->linear(tx, tw, &tb, wrong), Error);
}

TEST_F(CpuOpsTest, RmsnormAndAddRmsnorm) {
  const int64_t T = 5, H = 96;
  const float eps = 1e-5f;
  auto x = random_vector(rng_, T * H, 3.0f), d = random_vector(rng_, T * H), w = random_vector(rng_, H);
  auto reference = [&](const std::vector<double>& in) {
    std::vector<double> out(in.size());
    for (int64_t t = 0; t < T; ++t) {
      double ms = 0;
      for (int64_t i = 0; i < H; ++i) ms += in[t * H + i] * in[t * H + i] / H;
      for (int64_t i = 0; i < H; ++i) out[t * H + i] = in[t * H + i] / std::sqrt(ms + eps) * w[i];
    }
    return out;
  };
  Tensor tx = tensor(x, {T, H}), td = tensor(d, {T, H}), tw = tensor(w, {H});
  Tensor out = backend_->alloc(DType::F32, {T, H});
  backend_->rmsnorm(tx, tw, eps, out);
  EXPECT_LT(max_rel_diff(host(out), reference(std::vector<double>(x.begin(), x.end()))), 1e-6);

  std::vector<double> sum(T * H);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(x[i]) + d[i];
  backend_->add_rmsnorm(tx, td, tw, eps, out);
  EXPECT_LT(max_rel_diff(host(tx), sum), 1e-7);  // the residual now holds x + d
  EXPECT_LT(max_rel_diff(host(out), reference(sum)), 1e-6);
}

TEST_F(CpuOpsTest, EmbeddingAndGatherRows) {
  const int64_t V = 10, H = 8;
  auto table = random_vector(rng_, V * H);
  Tensor tt = tensor(table, {V, H});
  StepPlan plan;
  plan.token_ids = {7, 0, 9};
  plan.positions = {0, 1, 2};
  plan.token_seq = {0, 0, 0};
  plan.seqs = {SeqStep{.token_begin = 0, .num_tokens = 3}};
  plan.logit_rows = {2, 0};
  backend_->begin_step(plan);
  Tensor out = backend_->alloc(DType::F32, {3, H});
  backend_->embedding(tt, out);
  auto got = host(out);
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < H; ++i) EXPECT_EQ(got[t * H + i], table[plan.token_ids[t] * H + i]);
  Tensor gathered = backend_->alloc(DType::F32, {2, H});
  backend_->gather_logit_rows(out, gathered);
  auto g = host(gathered);
  for (int i = 0; i < H; ++i) {
    EXPECT_EQ(g[i], got[2 * H + i]);
    EXPECT_EQ(g[H + i], got[i]);
  }
  plan.token_ids[1] = int32_t(V);  // out of the vocabulary
  backend_->begin_step(plan);
  EXPECT_THROW(backend_->embedding(tt, out), Error);
  plan.positions[1] = 5;  // inconsistent with the sequence's context_begin
  EXPECT_THROW(backend_->begin_step(plan), Error);
}

TEST(RopeParamsTest, InvFreqMatchesSpecTable) {
  // docs/reference/SPEC.md 2.5, computed there in float64; ours is HF's float32 table, within a few ulps of it
  // (golden_logits_test checks it against HF's recorded table bit for bit).
  const double spec[32] = {1.000000000e+00, 6.890443059e-01, 4.747820555e-01, 3.271458719e-01, 2.254180002e-01,
                           1.553229895e-01, 1.070244215e-01, 7.374456821e-02, 5.081327482e-02, 3.170569618e-02,
                           1.933500113e-02, 1.159204926e-02, 6.794959490e-03, 3.860359317e-03, 2.093792379e-03,
                           1.052602101e-03, 4.564839192e-04, 1.293187012e-04, 3.830881237e-05, 2.639646903e-05,
                           1.818833668e-05, 1.253256982e-05, 8.635495875e-06, 5.950239261e-06, 4.099978482e-06,
                           2.825066827e-06, 1.946596211e-06, 1.341291035e-06, 9.242089502e-07, 6.368209146e-07,
                           4.387978251e-07, 3.023511428e-07};
  const RopeParams p = compute_rope_params(preset_config("gpt-oss-20b"));
  ASSERT_EQ(p.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(p.inv_freq[i] / spec[i], 1.0, 2e-7) << "i = " << i;  // ~3 ulp
  EXPECT_EQ(p.concentration, float(1.3465735902799727));
}

// Without a YaRN block the frequencies are HF's default RoPE, 1 / base^(2i/d), concentration 1.
TEST(RopeParamsTest, PlainRopeWithoutYarn) {
  GptOssConfig config = preset_config("gpt-oss-20b");
  config.rope.yarn = false;
  config.rope.factor = 1.0;
  const RopeParams p = compute_rope_params(config);
  ASSERT_EQ(p.inv_freq.size(), 32u);
  for (int i = 0; i < 32; ++i)
    EXPECT_NEAR(p.inv_freq[size_t(i)] * std::pow(150000.0, 2.0 * i / 64.0), 1.0, 2e-7) << "i = " << i;
  EXPECT_EQ(p.concentration, 1.0f);
}

// The angle is one float32 product and cos/sin are of that float32 angle: at position 131071 this is
// up to ~4e-3 rad away from the exact angle, and the reference (HF, OpenAI, vLLM) uses it.
TEST(RopeParamsTest, CosSinOfTheFloat32Angle) {
  const RopeParams p = compute_rope_params(preset_config("gpt-oss-20b"));
  double worst_vs_exact = 0.0;
  for (int32_t pos : {0, 1, 4095, 4299, 131071}) {
    for (size_t i = 0; i < p.inv_freq.size(); ++i) {
      float c = 0, s = 0;
      rope_cos_sin(pos, p.inv_freq[i], p.concentration, c, s);
      const float angle = float(pos) * p.inv_freq[i];
      EXPECT_EQ(c, float(std::cos(double(angle))) * p.concentration) << pos << " " << i;
      EXPECT_EQ(s, float(std::sin(double(angle))) * p.concentration) << pos << " " << i;
      const double exact = double(pos) * double(p.inv_freq[i]);
      worst_vs_exact = std::max(worst_vs_exact, std::abs(double(c) - std::cos(exact) * p.concentration));
    }
  }
  EXPECT_GT(worst_vs_exact, 1e-4) << "float32 angles at position 131071 must differ from exact ones";
}

// ---- attention: a small paged-cache world built independently of the backend and SingleSequenceRunner

constexpr int kHq = 8, kHkv = 2, kD = 32, kBlock = 16, kBlocksPerGroup = 96;
constexpr int kRow = (kHq + 2 * kHkv) * kD;

struct TestSequence {
  std::vector<float> qkv;                       // every position's qkv row, as rope_and_cache_write receives it
  std::vector<int> full_blocks, window_blocks;  // logical block -> physical block
  int cached = 0;
};

struct Chunk {
  int seq, count;
};

class AttentionTest : public CpuOpsTest {
 protected:
  AttentionTest() {
    KvCacheShape shape{.num_full_layers = 2,
                       .num_sliding_layers = 2,
                       .num_full_blocks = kBlocksPerGroup,
                       .num_window_blocks = kBlocksPerGroup,
                       .block_size = kBlock,
                       .num_kv_heads = kHkv,
                       .head_dim = kD};
    backend_->allocate_kv_cache(shape);
    for (auto* pool : {&free_full_, &free_window_}) {
      pool->resize(kBlocksPerGroup);
      std::iota(pool->begin(), pool->end(), 0);
      std::shuffle(pool->begin(), pool->end(), rng_);  // sequences get scattered, interleaved blocks
    }
    sinks_ = random_vector(rng_, kHq);
  }

  int add_sequence(int length) {
    seqs_.push_back(TestSequence{random_vector(rng_, size_t(length) * kRow), {}, {}, 0});
    return int(seqs_.size()) - 1;
  }

  // Builds the step for `chunks` (each continues its sequence), runs rope_and_cache_write with an
  // identity rotation and attention, and returns the output [T, Hq * D] with the reference.
  void run_step(const std::vector<Chunk>& chunks, const AttentionParams& params, bool minimal_window_table = true) {
    StepPlan plan;
    plan.block_size = kBlock;
    std::vector<float> qkv;
    for (const Chunk& c : chunks) {
      TestSequence& s = seqs_[size_t(c.seq)];
      SeqStep st{.token_begin = plan.num_tokens(), .num_tokens = c.count, .context_begin = s.cached};
      const int end = s.cached + c.count, last_block = (end - 1) / kBlock;
      while (int(s.full_blocks.size()) <= last_block) {
        s.full_blocks.push_back(take(free_full_));
        s.window_blocks.push_back(take(free_window_));
      }
      st.full_table_begin = int(plan.full_block_table.size());
      st.full_table_len = last_block + 1;
      plan.full_block_table.insert(plan.full_block_table.end(), s.full_blocks.begin(),
                                   s.full_blocks.begin() + last_block + 1);
      const int oldest = params.window > 0 ? std::max(0, s.cached - params.window + 1) : 0;
      st.window_first_block = minimal_window_table ? oldest / kBlock : 0;
      st.window_table_begin = int(plan.window_block_table.size());
      st.window_table_len = last_block + 1 - st.window_first_block;
      plan.window_block_table.insert(plan.window_block_table.end(), s.window_blocks.begin() + st.window_first_block,
                                     s.window_blocks.begin() + last_block + 1);
      for (int p = s.cached; p < end; ++p) {
        plan.token_ids.push_back(0);
        plan.positions.push_back(p);
        plan.token_seq.push_back(plan.num_seqs());
        plan.full_slots.push_back(s.full_blocks[p / kBlock] * kBlock + p % kBlock);
        plan.window_slots.push_back(s.window_blocks[p / kBlock] * kBlock + p % kBlock);
        qkv.insert(qkv.end(), s.qkv.begin() + int64_t(p) * kRow, s.qkv.begin() + int64_t(p + 1) * kRow);
      }
      plan.seqs.push_back(st);
    }
    const int64_t T = plan.num_tokens();
    backend_->begin_step(plan);
    Tensor tqkv = tensor(qkv, {T, kRow}), tsinks = tensor(sinks_, {kHq});
    Tensor out = backend_->alloc(DType::F32, {T, kHq * kD});
    RopeParams identity{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f};  // cos 1, sin 0
    backend_->rope_and_cache_write(tqkv, identity, params);
    backend_->attention(tqkv, tsinks, params, out);
    got_ = host(out);

    ref_.clear();
    for (const Chunk& c : chunks) {
      TestSequence& s = seqs_[size_t(c.seq)];
      for (int i = s.cached; i < s.cached + c.count; ++i) append_reference(s, i, params);
      s.cached += c.count;
    }
  }

  // Softmax over the visible keys plus the sink, directly from the stored rows.
  void append_reference(const TestSequence& s, int i, const AttentionParams& params) {
    for (int h = 0; h < kHq; ++h) {
      const int g = h / (kHq / kHkv);
      const float* q = &s.qkv[size_t(i) * kRow + h * kD];
      std::vector<double> logits;
      std::vector<int> keys;
      for (int j = 0; j <= i; ++j) {
        if (params.window > 0 && i - j >= params.window) continue;
        const float* k = &s.qkv[size_t(j) * kRow + (kHq + g) * kD];
        double dotp = 0;
        for (int d = 0; d < kD; ++d) dotp += double(q[d]) * k[d];
        logits.push_back(dotp * params.sm_scale);
        keys.push_back(j);
      }
      double m = sinks_[h];
      for (double l : logits) m = std::max(m, l);
      double denom = std::exp(sinks_[h] - m);
      for (double l : logits) denom += std::exp(l - m);
      for (int d = 0; d < kD; ++d) {
        double acc = 0;
        for (size_t n = 0; n < keys.size(); ++n)
          acc += std::exp(logits[n] - m) * s.qkv[size_t(keys[n]) * kRow + (kHq + kHkv + g) * kD + d];
        ref_.push_back(acc / denom);
      }
    }
  }

  static int take(std::vector<int>& pool) {
    EXPECT_FALSE(pool.empty()) << "test pool exhausted";
    int b = pool.back();
    pool.pop_back();
    return b;
  }

  static AttentionParams params(KvGroup group, int window, int layer = 1) {
    return AttentionParams{.group = group,
                           .layer_in_group = layer,
                           .window = window,
                           .num_q_heads = kHq,
                           .num_kv_heads = kHkv,
                           .head_dim = kD,
                           .sm_scale = float(1.0 / std::sqrt(kD))};
  }

  std::vector<TestSequence> seqs_;
  std::vector<int> free_full_, free_window_;
  std::vector<float> sinks_;
  std::vector<float> got_;
  std::vector<double> ref_;
};

TEST_F(AttentionTest, FullCausalPrefillOverScatteredBlocks) {
  int s = add_sequence(150);
  run_step({{s, 150}}, params(KvGroup::Full, 0));
  EXPECT_LT(max_rel_diff(got_, ref_), 1e-5);
}

TEST_F(AttentionTest, SlidingWindowPrefillBothTableShapes) {
  for (bool minimal : {true, false}) {
    int s = add_sequence(300);
    run_step({{s, 300}}, params(KvGroup::Sliding, 128), minimal);
    EXPECT_LT(max_rel_diff(got_, ref_), 1e-5) << "minimal window table " << minimal;
  }
}

TEST_F(AttentionTest, WindowOnTheFullPoolToo) {
  int s = add_sequence(200);
  run_step({{s, 200}}, params(KvGroup::Full, 128, 0));
  EXPECT_LT(max_rel_diff(got_, ref_), 1e-5);
}

TEST_F(AttentionTest, ChunkedPrefillReadsEarlierChunksFromTheCache) {
  for (KvGroup group : {KvGroup::Full, KvGroup::Sliding}) {
    const int window = group == KvGroup::Sliding ? 128 : 0;
    int s = add_sequence(260);
    for (int count : {100, 37, 1, 122}) {
      run_step({{s, count}}, params(group, window));
      EXPECT_LT(max_rel_diff(got_, ref_), 1e-5) << "chunk of " << count;
    }
  }
}

TEST_F(AttentionTest, SeveralSequencesInOnePlan) {
  int a = add_sequence(300), b = add_sequence(140), c = add_sequence(20);
  for (KvGroup group : {KvGroup::Sliding, KvGroup::Full}) {
    const int window = group == KvGroup::Sliding ? 128 : 0;
    // The first step prefills a and b; the second mixes a chunk of a, a decode of b and all of c.
    for (auto& s : seqs_) s.cached = 0, s.full_blocks.clear(), s.window_blocks.clear();
    free_full_.resize(kBlocksPerGroup), free_window_.resize(kBlocksPerGroup);
    std::iota(free_full_.begin(), free_full_.end(), 0), std::iota(free_window_.begin(), free_window_.end(), 0);
    std::shuffle(free_full_.begin(), free_full_.end(), rng_),
        std::shuffle(free_window_.begin(), free_window_.end(), rng_);
    run_step({{a, 200}, {b, 139}}, params(group, window));
    EXPECT_LT(max_rel_diff(got_, ref_), 1e-5);
    run_step({{a, 100}, {b, 1}, {c, 20}}, params(group, window));
    EXPECT_LT(max_rel_diff(got_, ref_), 1e-5);
  }
}

// A single key with a dominant logit: the output is its value iff the key is visible.
TEST_F(AttentionTest, WindowEdgeKeysAt127And128Back) {
  for (int back : {127, 128}) {
    int s = add_sequence(200);
    auto& rows = seqs_[size_t(s)].qkv;
    const int i = 199, spike = i - back;
    for (int p = 0; p < 200; ++p)
      for (int g = 0; g < kHkv; ++g)
        for (int d = 0; d < kD; ++d) {
          rows[size_t(p) * kRow + (kHq + g) * kD + d] = p == spike ? 1.0f : 0.0f;         // k
          rows[size_t(p) * kRow + (kHq + kHkv + g) * kD + d] = p == spike ? 1.0f : 0.0f;  // v
        }
    for (int h = 0; h < kHq; ++h)
      for (int d = 0; d < kD; ++d) rows[size_t(i) * kRow + h * kD + d] = 3.0f;  // q.k_spike * scale = 17
    run_step({{s, 200}}, params(KvGroup::Sliding, 128));
    EXPECT_LT(max_rel_diff(got_, ref_), 1e-5);
    const float last_out = got_[size_t(i) * kHq * kD];
    if (back == 127)
      EXPECT_GT(last_out, 0.99f);
    else
      EXPECT_LT(last_out, 0.01f);
  }
}

TEST_F(AttentionTest, PlanThatDoesNotCoverTheWindowIsAnError) {
  int s = add_sequence(200);
  run_step({{s, 150}}, params(KvGroup::Sliding, 128));
  StepPlan plan;
  plan.block_size = kBlock;
  plan.token_ids = {0};
  plan.positions = {150};
  plan.token_seq = {0};
  plan.full_slots = {0};
  plan.window_slots = {0};
  // The query at 150 sees keys from 23 (block 1), but the window table starts at block 9.
  plan.seqs = {SeqStep{.token_begin = 0,
                       .num_tokens = 1,
                       .context_begin = 150,
                       .window_table_begin = 0,
                       .window_table_len = 1,
                       .window_first_block = 9}};
  plan.window_block_table = {0};
  backend_->begin_step(plan);
  Tensor qkv = backend_->alloc(DType::F32, {1, kRow}), out = backend_->alloc(DType::F32, {1, kHq * kD});
  Tensor sinks = tensor(sinks_, {kHq});
  EXPECT_THROW(backend_->attention(qkv, sinks, params(KvGroup::Sliding, 128), out), Error);
  plan.seqs[0].window_first_block = 1;
  plan.seqs[0].window_table_len = 9;
  plan.window_block_table = {0, 1, 2, 3, 4, 5, 6, 7, kBlocksPerGroup};  // last entry is no block
  backend_->begin_step(plan);
  EXPECT_THROW(backend_->attention(qkv, sinks, params(KvGroup::Sliding, 128), out), Error);
  plan.window_slots = {kBlocksPerGroup * kBlock};  // a write slot past the cache
  backend_->begin_step(plan);
  EXPECT_THROW(backend_->rope_and_cache_write(
                   qkv, RopeParams{.inv_freq = std::vector<float>(kD / 2, 0.0f), .concentration = 1.0f},
                   params(KvGroup::Sliding, 128)),
               Error);
}

TEST_F(CpuOpsTest, RopeRotatesQAndKHalvesAndLeavesV) {
  const int T = 4;
  const std::vector<int> positions = {0, 1, 4097, 131000};
  auto qkv = random_vector(rng_, size_t(T) * kRow);
  KvCacheShape shape{.num_full_layers = 1,
                     .num_sliding_layers = 0,
                     .num_full_blocks = 1,
                     .num_window_blocks = 0,
                     .block_size = kBlock,
                     .num_kv_heads = kHkv,
                     .head_dim = kD};
  backend_->allocate_kv_cache(shape);
  StepPlan plan;
  plan.block_size = kBlock;
  for (int t = 0; t < T; ++t) {
    // Four one-token sequences at far-apart positions; only their rotation matters here.
    plan.token_ids.push_back(0), plan.positions.push_back(positions[t]), plan.token_seq.push_back(t);
    plan.full_slots.push_back(t);
    plan.seqs.push_back(SeqStep{.token_begin = t, .num_tokens = 1, .context_begin = positions[t]});
  }
  GptOssConfig config = preset_config("gpt-oss-20b");
  config.head_dim = kD;
  const RopeParams rope = compute_rope_params(config);
  Tensor t = tensor(qkv, {T, kRow});
  // No block tables: rope_and_cache_write only needs the write slots.
  AttentionParams ap{.group = KvGroup::Full,
                     .layer_in_group = 0,
                     .window = 0,
                     .num_q_heads = kHq,
                     .num_kv_heads = kHkv,
                     .head_dim = kD};
  backend_->begin_step(plan);
  backend_->rope_and_cache_write(t, rope, ap);
  auto got = host(t);
  std::vector<double> ref(qkv.begin(), qkv.end());
  for (int tok = 0; tok < T; ++tok)
    for (int head = 0; head < kHq + kHkv; ++head)
      for (int i = 0; i < kD / 2; ++i) {
        // The reference's float32 angle (one float32 product), written out here independently.
        const float angle = float(positions[tok]) * rope.inv_freq[i];
        const double c = double(float(std::cos(double(angle))) * rope.concentration);
        const double s = double(float(std::sin(double(angle))) * rope.concentration);
        const size_t base = size_t(tok) * kRow + size_t(head) * kD;
        ref[base + i] = qkv[base + i] * c - qkv[base + i + kD / 2] * s;
        ref[base + i + kD / 2] = qkv[base + i + kD / 2] * c + qkv[base + i] * s;
      }
  EXPECT_LT(max_rel_diff(got, ref), 1e-5);
}

TEST_F(CpuOpsTest, RouterTopkThenSoftmaxOverTheChosen) {
  const int64_t T = 9, H = 24, E = 16;
  const int k = 4;
  auto x = random_vector(rng_, T * H), w = random_vector(rng_, E * H), b = random_vector(rng_, E);
  Tensor tx = tensor(x, {T, H}), tw = tensor(w, {E, H}), tb = tensor(b, {E});
  Tensor ids = backend_->alloc(DType::I32, {T, k}), weights = backend_->alloc(DType::F32, {T, k});
  backend_->router_topk(tx, tw, tb, k, ids, weights);
  auto got_ids = host(ids), got_w = host(weights);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> logits(E);
    for (int64_t e = 0; e < E; ++e) {
      logits[e] = b[e];
      for (int64_t i = 0; i < H; ++i) logits[e] += double(x[t * H + i]) * w[e * H + i];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int l, int r) { return logits[l] > logits[r]; });
    double denom = 0;
    for (int j = 0; j < k; ++j) denom += std::exp(logits[order[j]] - logits[order[0]]);
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(int(got_ids[t * k + j]), order[j]) << "token " << t << " slot " << j;
      EXPECT_NEAR(got_w[t * k + j], std::exp(logits[order[j]] - logits[order[0]]) / denom, 1e-6);
    }
  }
  Tensor bad_ids = backend_->alloc(DType::I32, {T, k + 1});
  EXPECT_THROW(backend_->router_topk(tx, tw, tb, k, bad_ids, weights), Error);
}

TEST_F(CpuOpsTest, MoeMatchesPerTokenLoopWithClamps) {
  const int64_t T = 7, H = 40, I = 24, E = 6;
  const int k = 3;
  // Large enough weights that gate/up values cross +-7, so both clamps are exercised.
  auto x = random_vector(rng_, T * H), w1 = random_vector(rng_, E * 2 * I * H, 1.5f),
       b1 = random_vector(rng_, E * 2 * I);
  auto w2 = random_vector(rng_, E * H * I, 0.3f), b2 = random_vector(rng_, E * H);
  std::vector<float> ids_f, wts;
  std::vector<int32_t> ids;
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    for (int j = 0; j < k; ++j) ids.push_back(all[j]), wts.push_back(u(rng_));
  }
  Tensor tx = tensor(x, {T, H}), tw = tensor(wts, {T, k});
  Tensor tids = backend_->alloc(DType::I32, {T, k});
  backend_->from_host(tids, ids.data());
  ExpertWeights ew;
  ew.gate_up_w = tensor(w1, {E, 2 * I, H}), ew.gate_up_b = tensor(b1, {E, 2 * I});
  ew.down_w = tensor(w2, {E, H, I}), ew.down_b = tensor(b2, {E, H});
  ew.experts = E, ew.hidden = H, ew.intermediate = I;
  Tensor out = backend_->alloc(DType::F32, {T, H});
  backend_->moe(tx, ew, tids, tw, SwigluParams{}, out);

  std::vector<double> ref(T * H, 0.0);
  int clamped_gate = 0, clamped_up = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      std::vector<double> act(I);
      for (int64_t c = 0; c < I; ++c) {
        double gate = b1[e * 2 * I + 2 * c], up = b1[e * 2 * I + 2 * c + 1];
        for (int64_t i = 0; i < H; ++i) {
          gate += double(w1[(e * 2 * I + 2 * c) * H + i]) * x[t * H + i];
          up += double(w1[(e * 2 * I + 2 * c + 1) * H + i]) * x[t * H + i];
        }
        clamped_gate += gate > 7.0, clamped_up += std::abs(up) > 7.0;
        gate = std::min(gate, 7.0);
        up = std::max(-7.0, std::min(up, 7.0));
        act[c] = gate / (1.0 + std::exp(-1.702 * gate)) * (up + 1.0);
      }
      for (int64_t r = 0; r < H; ++r) {
        double y = b2[e * H + r];
        for (int64_t c = 0; c < I; ++c) y += double(w2[(e * H + r) * I + c]) * act[c];
        ref[t * H + r] += wts[t * k + j] * y;
      }
    }
  EXPECT_GT(clamped_gate, 0);
  EXPECT_GT(clamped_up, 0);
  EXPECT_LT(max_rel_diff(host(out), ref), 1e-5);

  ids[3] = int32_t(E);  // no such expert
  backend_->from_host(tids, ids.data());
  EXPECT_THROW(backend_->moe(tx, ew, tids, tw, SwigluParams{}, out), Error);
}

}  // namespace
}  // namespace ossrt
