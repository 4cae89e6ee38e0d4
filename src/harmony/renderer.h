#pragma once
// Harmony renderer: Conversation -> prompt token ids (docs/reference/SPEC.md 5.1-5.8). Every text piece is encoded
// with ordinary BPE and special ids are inserted directly, exactly as harmony does, so text in a
// user or tool message can never forge Harmony structure.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "harmony/conversation.h"
#include "harmony/prompt_too_long.h"
#include "harmony/typescript_schema.h"

namespace ossrt {
class Tokenizer;
}

namespace ossrt::harmony {

struct RenderedPrompt {
  std::vector<int32_t> token_ids;
  std::string text;  // the same prompt with special tokens spelled out ("<|start|>system...")
};

// Which past `analysis` messages survive in the prompt (docs/reference/SPEC.md 5.8).
enum class AnalysisHistory {
  // docs/reference/SPEC.md 5.8 recommendation / format.md: analysis that precedes a `final` of the same turn (turns
  // are split at user messages) is dropped; analysis of a turn without a final yet (a tool loop)
  // is kept.
  DropCompletedTurns,
  KeepAll,  // render every message (round-trip tests, training-style dumps)
};

struct RenderOptions {
  AnalysisHistory analysis_history = AnalysisHistory::DropCompletedTurns;
  bool add_generation_prompt = true;  // append <|start|>assistant
  // A prompt of more tokens than this throws PromptTooLong (harmony/prompt_too_long.h) as soon as
  // that is certain, before the rest is rendered or tokenized. The server passes the context length.
  size_t max_tokens = SIZE_MAX;
};

// System + developer (when it has content) + history (+ <|start|>assistant). Throws ossrt::Error
// only for conversations that cannot be rendered (a tool message without a name).
RenderedPrompt render_conversation(const Conversation& conversation, const Tokenizer& tokenizer,
                                   const RenderOptions& options);

// The prompt for the next assistant turn: render_conversation with the default options (and
// `max_tokens`).
RenderedPrompt render_for_completion(const Conversation& conversation, const Tokenizer& tokenizer,
                                     size_t max_tokens = SIZE_MAX);

// Building blocks, exposed for golden tests and the server's render route.
std::string system_message_body(const Conversation& conversation);
// Empty -> not rendered. Tool signatures longer than `budget` throw PromptTooLong.
std::string developer_message_body(const Conversation& conversation, const RenderBudget& budget = {});
// The messages that survive the history rule, in order.
std::vector<Message> messages_after_history_rule(const std::vector<Message>& messages, AnalysisHistory rule);

}  // namespace ossrt::harmony
