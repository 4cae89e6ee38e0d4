#pragma once
// The sampling stop set for gpt-oss (docs/reference/SPEC.md 4, docs/reference/SERVING.md 4): {<|return|>, <|call|>,
// <|endoftext|>}. Never <|end|>: the model ends its analysis with <|end|> and continues with
// <|start|>assistant<|channel|>final... inside the same turn.
#include <array>
#include <cstdint>

#include "harmony/special_tokens.h"

namespace ossrt::harmony {

inline constexpr std::array<int32_t, 3> kSamplingStopTokens = {kReturnId, kCallId, kEndOfTextId};

// True when sampling must stop after emitting `id` (the id itself is still given to the parser).
constexpr bool is_stop_token(int32_t id) { return id == kReturnId || id == kCallId || id == kEndOfTextId; }

// Why generation stopped, as the OpenAI finish_reason wants it: <|call|> -> "tool_calls",
// <|return|> / <|endoftext|> -> "stop". Only meaningful when is_stop_token(id).
constexpr bool is_tool_call_stop(int32_t id) { return id == kCallId; }

}  // namespace ossrt::harmony
