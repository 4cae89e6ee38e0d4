#pragma once
// The Harmony formatting tokens of o200k_harmony (docs/reference/SPEC.md 4). They are fixed by the checkpoint, so
// they are compile-time constants here; harmony_render_test checks each one against the tokenizer.
#include <cstdint>
#include <string_view>

namespace ossrt::harmony {

inline constexpr int32_t kEndOfTextId = 199999;  // <|endoftext|>
inline constexpr int32_t kReturnId = 200002;     // <|return|>: ends the final answer (stop)
inline constexpr int32_t kConstrainId = 200003;  // <|constrain|>: content-type marker in headers
inline constexpr int32_t kChannelId = 200005;    // <|channel|>
inline constexpr int32_t kStartId = 200006;      // <|start|>
inline constexpr int32_t kEndId = 200007;        // <|end|>: ends any other message (NOT a stop)
inline constexpr int32_t kMessageId = 200008;    // <|message|>: header -> content
inline constexpr int32_t kCallId = 200012;       // <|call|>: ends a tool call (stop)

inline constexpr std::string_view kEndOfTextText = "<|endoftext|>";
inline constexpr std::string_view kReturnText = "<|return|>";
inline constexpr std::string_view kConstrainText = "<|constrain|>";
inline constexpr std::string_view kChannelText = "<|channel|>";
inline constexpr std::string_view kStartText = "<|start|>";
inline constexpr std::string_view kEndText = "<|end|>";
inline constexpr std::string_view kMessageText = "<|message|>";
inline constexpr std::string_view kCallText = "<|call|>";

}  // namespace ossrt::harmony
