#include "engine/replay_drafter.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "core/error.h"
#include "sampling/sampler.h"

namespace ossrt {

ReplayDrafter::ReplayDrafter(double acceptance_rate, size_t max_recorded)
    : rate_(acceptance_rate), max_recorded_(max_recorded) {
  OSSRT_CHECK(acceptance_rate >= 0 && acceptance_rate <= 1, "replay drafter: acceptance rate {} outside [0, 1]",
              acceptance_rate);
}

Draft ReplayDrafter::propose(const DraftRequest& r) {
  const int prompt_len = int(r.tokens.size()) - r.position;
  if (r.max_tokens <= 0 || prompt_len < 0) return {};
  const std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + prompt_len);
  const auto it = recorded_.find(prompt);
  if (it == recorded_.end()) return {};
  const std::vector<int32_t>& out = it->second;
  const size_t done = size_t(r.position);
  if (done >= out.size() || !std::equal(r.tokens.begin() + prompt_len, r.tokens.end(), out.begin())) return {};
  // A draw from (prompt, position) alone, so a replayed run is reproducible.
  const uint64_t key = std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(prompt.data()), prompt.size() * sizeof(int32_t)));
  Draft d;
  for (size_t i = done; i < out.size() && int(d.tokens.size()) < r.max_tokens; ++i) {
    const double u = uniform_draw(key, i);
    // A wrong guess differs from the recorded token and stays below an even vocabulary's size.
    d.tokens.push_back(u < rate_ ? out[i] : (out[i] ^ 1));
  }
  return d;
}

void ReplayDrafter::finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) {
  (void)sequence;
  if (int(tokens.size()) <= prompt_len) return;
  std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + prompt_len);
  std::vector<int32_t> output(tokens.begin() + prompt_len, tokens.end());
  auto it = recorded_.find(prompt);
  if (it != recorded_.end()) {
    if (output.size() > it->second.size()) it->second = std::move(output);
    return;
  }
  if (recorded_.size() >= max_recorded_) return;  // a benchmark's prompts fit; more are not recorded
  recorded_.emplace(std::move(prompt), std::move(output));
}

}  // namespace ossrt
