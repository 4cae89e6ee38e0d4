#pragma once
// Thrown while rendering a prompt that is certain to exceed the token limit it was given
// (RenderOptions::max_tokens): the renderer stops as soon as it knows, instead of building and
// tokenizing megabytes of text first (issue 19: tool schemas nested 1,000 levels deep rendered
// for minutes before the request could be refused).
#include <cstddef>

#include "core/error.h"

namespace ossrt::harmony {

class PromptTooLong : public ossrt::Error {
 public:
  explicit PromptTooLong(size_t max_tokens);
  size_t max_tokens() const { return max_tokens_; }

 private:
  size_t max_tokens_;
};

}  // namespace ossrt::harmony
