#include "engine/draft_model_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

DraftModelDrafter::DraftModelDrafter(GptOssModel& model, int max_model_len, int block_size)
    : runner_(model, max_model_len, block_size), max_model_len_(max_model_len) {}

Draft DraftModelDrafter::propose(const DraftRequest& in) {
  int max_tokens = in.max_tokens;
  if (max_tokens <= 0 || in.tokens.empty()) return {};
  if (owner_ && *owner_ != in.sequence) return {};
  if (!owner_) {
    owner_ = in.sequence;
    fed_.clear();
    runner_.reset();
  }
  // Keep the cached prefix the sequence still shares (its accepted tokens); the rest of the cache
  // (rejected guesses) is overwritten. The last token always runs again: its logits pick guess 1.
  const size_t n = in.tokens.size();
  size_t same = 0;
  while (same < fed_.size() && same < n && fed_[same] == in.tokens[same]) ++same;
  same = std::min(same, n - 1);
  max_tokens = std::min(max_tokens, max_model_len_ - int(n) + 1);
  if (max_tokens <= 0) return {};
  runner_.rewind(int(same));
  fed_.resize(same);
  const std::span<const int32_t> fresh = in.tokens.subspan(same);
  std::vector<float> logits = runner_.run(fresh, 0, SequenceRunnerBase::Logits::LastRow);
  fed_.insert(fed_.end(), fresh.begin(), fresh.end());
  tokens_run_ += int64_t(fresh.size());

  Draft draft;
  for (int i = 0; i < max_tokens; ++i) {
    // Greedy, the lowest id on ties: what the target's greedy choice would be from these logits.
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    draft.tokens.push_back(next);
    if (i + 1 == max_tokens) break;
    const int32_t one[1] = {next};
    logits = runner_.run(one, 1, SequenceRunnerBase::Logits::LastRow);
    fed_.push_back(next);
    ++tokens_run_;
  }
  return draft;
}

void DraftModelDrafter::finished(uint64_t sequence, std::span<const int32_t> tokens, int prompt_len) {
  (void)tokens, (void)prompt_len;
  if (owner_ && *owner_ == sequence) {
    owner_.reset();
    fed_.clear();
  }
}

}  // namespace ossrt
