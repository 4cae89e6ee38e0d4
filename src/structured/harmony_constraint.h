#pragma once
// The token constraint for a gpt-oss assistant turn, Harmony-aware (docs/reference/SERVING.md 4: the grammar
// applies after <|channel|>final<|message|>, never to reasoning).
//
// Two modes:
//  - enforce (structured outputs, forced tool calls): every message header is forced into the
//    form Harmony writes: `<|channel|>analysis<|message|>`, `<|channel|>final<|message|>`, or
//    `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>` for the allowed
//    tools, with `<|start|>assistant` between messages. Analysis content is free text; final
//    content follows the response format's grammar and, once that grammar is complete, only
//    <|return|> may follow; tool-call arguments follow the tool's grammar, then only <|call|>.
//  - passive (a reasoning budget alone): tokens are only tracked; nothing is restricted until
//    the budget is spent.
// In both, a reasoning budget bounds the analysis CONTENT tokens of the turn (header and
// <|end|> not counted): when it is spent, only <|end|> may follow, then the header of the final
// answer is forced (<|start|>assistant<|channel|>final<|message|>).
//
// The prompt's tail (after its last <|start|>) is replayed first, so a prompt that already holds
// a forced header (tool_choice named / required) starts inside it. Special token ids come from
// the vocabulary's special-token texts. Not thread-safe (one per request).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sampling/token_constraint.h"
#include "structured/compiled_grammar.h"
#include "structured/matcher.h"
#include "structured/vocabulary.h"

namespace ossrt::structured {

struct HarmonyTokens {
  int32_t start = -1, end = -1, message = -1, channel = -1, constrain = -1, ret = -1, call = -1, endoftext = -1;
  // Looks up "<|start|>" etc. among the vocabulary's special tokens; throws if one is missing.
  static HarmonyTokens find(const Vocabulary& vocab);
};

struct HarmonyToolSpec {
  std::string name;
  std::shared_ptr<const CompiledGrammar> arguments;  // null: free text
};

struct HarmonySpec {
  bool enforce = true;
  std::shared_ptr<const CompiledGrammar> final_format;  // null: free final text
  bool allow_final = true;                              // false: the turn must call a tool
  std::vector<HarmonyToolSpec> tools;                   // functions the model may call
  std::optional<int32_t> reasoning_budget;              // analysis content tokens
};

class HarmonyConstraint final : public TokenConstraint {
 public:
  // Throws std::invalid_argument if, in enforce mode, the prompt tail is not a valid start of
  // an enforced assistant message (a server bug, not a client error).
  HarmonyConstraint(HarmonySpec spec, std::shared_ptr<const Vocabulary> vocab, HarmonyTokens tokens,
                    std::span<const int32_t> prompt);

  int32_t vocab_size() const override { return vocab_->size(); }
  bool fill_mask(std::span<uint32_t> mask) override;
  bool accept(int32_t token) override;
  void rollback(int n) override;

  int32_t analysis_tokens() const { return state_.analysis_used; }
  bool finished() const { return state_.phase == Phase::Done; }

 private:
  enum class Phase : uint8_t { Header, ExpectStart, Role, ExpectChannel, Channel, ConstrainType, Content, Done };
  enum class Channel : uint8_t { Other, Analysis, Final, Call };
  struct State {
    Phase phase = Phase::Header;
    Channel channel = Channel::Other;
    int32_t tool = -1;
    std::string text;  // header text so far (Role, Channel, ConstrainType; passive Header)
    int32_t analysis_used = 0;
    bool forcing = false;  // passive mode: forcing the end of the analysis
    int32_t matcher_steps = 0;
  };

  bool enforcing() const { return spec_.enforce || state_.forcing; }
  bool budget_spent() const { return spec_.reasoning_budget && state_.analysis_used >= *spec_.reasoning_budget; }
  std::vector<std::pair<std::string, int32_t>> header_alternatives() const;  // (text, terminator id)
  bool accept_enforced(int32_t token, State& s);
  bool accept_passive(int32_t token, State& s);
  void enter_content(State& s, Channel channel, int32_t tool);
  void literal_mask(std::string_view remaining, std::span<uint32_t> mask) const;

  HarmonySpec spec_;
  std::shared_ptr<const Vocabulary> vocab_;
  HarmonyTokens t_;
  State state_;
  std::vector<State> history_;
  std::optional<GrammarMatcher> matcher_;  // for the final / call content
};

// A grammar over the whole output (no Harmony), e.g. /v1/completions: when the grammar is
// complete, only the end tokens may follow; after one, nothing is restricted.
class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> end_tokens);
  int32_t vocab_size() const override { return matcher_.grammar().vocab().size(); }
  bool fill_mask(std::span<uint32_t> mask) override;
  bool accept(int32_t token) override;
  void rollback(int n) override;

 private:
  GrammarMatcher matcher_;
  std::vector<int32_t> end_tokens_;
  std::vector<bool> ended_;  // per accepted token: the output had ended by then
};

}  // namespace ossrt::structured
