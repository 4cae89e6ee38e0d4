#include "engine/output_filter.h"

#include <algorithm>

#include "core/error.h"

namespace ossrt {

OutputFilter::OutputFilter(const SamplingParams& params, std::vector<int32_t> stop_ids, TokenBytesFn token_bytes)
    : params_(params), stop_ids_(std::move(stop_ids)), token_bytes_(std::move(token_bytes)) {
  if (!params_.stop_strings.empty()) {
    OSSRT_CHECK(bool(token_bytes_), "stop strings need a tokenizer (the engine was built without token bytes)");
    for (const auto& s : params_.stop_strings) OSSRT_CHECK(!s.empty(), "stop strings must not be empty");
  }
}

void OutputFilter::release_until(size_t count, FilterResult& out) {
  count = std::min(count, held_.size());
  for (size_t i = 0; i < count; ++i) {
    out.released.push_back(held_[i].token);
    if (held_[i].logprob) out.released_logprobs.push_back(std::move(*held_[i].logprob));
  }
  const size_t cut = count == 0 ? 0 : held_[count - 1].end;
  held_.erase(held_.begin(), held_.begin() + std::ptrdiff_t(count));
  held_text_.erase(0, cut);
  for (auto& h : held_) h.end -= cut;
}

size_t OutputFilter::undecided_suffix_start() const {
  size_t start = held_text_.size();
  for (const auto& stop : params_.stop_strings) {
    const size_t longest = std::min(stop.size() - 1, held_text_.size());
    for (size_t len = longest; len > 0; --len) {
      if (held_text_.compare(held_text_.size() - len, len, stop, 0, len) == 0) {
        start = std::min(start, held_text_.size() - len);
        break;
      }
    }
  }
  return start;
}

FilterResult OutputFilter::push(int32_t token, std::optional<TokenLogprob> logprob, int num_output,
                                bool at_context_limit) {
  FilterResult out;
  const bool may_stop = num_output >= params_.min_tokens;
  const bool is_stop_id = std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end();
  if (may_stop && is_stop_id) {
    if (params_.include_stop_str_in_output) {
      held_.push_back({token, std::move(logprob), held_text_.size()});
    }
    release_until(held_.size(), out);
    out.finished = true;
    out.reason = FinishReason::Stop;
    out.stop_token = token;
    return out;
  }

  if (params_.stop_strings.empty()) {
    out.released.push_back(token);
    if (logprob) out.released_logprobs.push_back(std::move(*logprob));
  } else {
    held_text_ += token_bytes_(token);
    held_.push_back({token, std::move(logprob), held_text_.size()});
    // Earliest match wins; among matches at the same offset, the one listed first.
    std::optional<std::pair<size_t, const std::string*>> match;
    if (may_stop) {
      for (const auto& stop : params_.stop_strings) {
        const size_t at = held_text_.find(stop);
        if (at != std::string::npos && (!match || at < match->first)) match = std::make_pair(at, &stop);
      }
    }
    if (match) {
      const size_t begin = match->first, end = begin + match->second->size();
      size_t keep = 0;
      if (params_.include_stop_str_in_output) {
        while (keep < held_.size() && held_[keep].end < end) ++keep;
        keep = std::min(keep + 1, held_.size());  // through the token holding the match's last byte
      } else {
        while (keep < held_.size() && held_[keep].end <= begin) ++keep;  // tokens wholly before the match
      }
      release_until(keep, out);
      held_.clear();
      held_text_.clear();
      out.finished = true;
      out.reason = FinishReason::Stop;
      out.stop_string = *match->second;
      return out;
    }
    const size_t undecided = undecided_suffix_start();
    size_t decided = 0;
    while (decided < held_.size() && held_[decided].end <= undecided) ++decided;
    release_until(decided, out);
  }

  if (num_output >= params_.max_tokens || at_context_limit) {
    release_until(held_.size(), out);
    out.finished = true;
    out.reason = FinishReason::Length;
  }
  return out;
}

}  // namespace ossrt
