#include "structured/harmony_constraint.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "core/error.h"

namespace ossrt::structured {

namespace {
constexpr std::string_view kAssistant = "assistant";
constexpr std::string_view kJson = "json";
constexpr size_t kMaxPassiveHeader = 4096;  // bytes of a header the passive tracker keeps
}  // namespace

HarmonyTokens HarmonyTokens::find(const Vocabulary& v) {
  HarmonyTokens t;
  const std::pair<std::string_view, int32_t*> names[] = {
      {"<|start|>", &t.start},         {"<|end|>", &t.end},
      {"<|message|>", &t.message},     {"<|channel|>", &t.channel},
      {"<|constrain|>", &t.constrain}, {"<|return|>", &t.ret},
      {"<|call|>", &t.call},           {"<|endoftext|>", &t.endoftext}};
  for (int32_t id = 0; id < v.size(); ++id) {
    if (v.ordinary(id)) continue;
    for (auto& [text, slot] : names)
      if (*slot < 0 && v.bytes(id) == text) *slot = id;
  }
  for (auto& [text, slot] : names) OSSRT_CHECK(*slot >= 0, "the vocabulary has no special token {}", text);
  return t;
}

HarmonyConstraint::HarmonyConstraint(HarmonySpec spec, std::shared_ptr<const Vocabulary> vocab, HarmonyTokens tokens,
                                     std::span<const int32_t> prompt)
    : spec_(std::move(spec)), vocab_(std::move(vocab)), t_(tokens) {
  // Replay the prompt from just after its last <|start|>.
  size_t from = 0;
  bool have_start = false;
  for (size_t i = prompt.size(); i-- > 0;)
    if (prompt[i] == t_.start) {
      from = i + 1;
      have_start = true;
      break;
    }
  if (spec_.enforce) {
    if (!have_start) throw std::invalid_argument("harmony constraint: the prompt has no <|start|>");
    state_.phase = Phase::Role;
  } else {
    state_.phase = Phase::Header;
    if (!have_start) from = prompt.size();  // not a Harmony prompt: track from here
  }
  for (size_t i = from; i < prompt.size(); ++i)
    if (!accept(prompt[i]))
      throw std::invalid_argument("harmony constraint: the prompt's last header does not fit the constraint");
  history_.clear();  // the prompt cannot be rolled back
}

std::vector<std::pair<std::string, int32_t>> HarmonyConstraint::header_alternatives() const {
  std::vector<std::pair<std::string, int32_t>> alts;
  if (state_.forcing) return {{"final", t_.message}};
  if (!budget_spent()) alts.push_back({"analysis", t_.message});
  if (spec_.allow_final) alts.push_back({"final", t_.message});
  for (const HarmonyToolSpec& tool : spec_.tools)
    alts.push_back({"commentary to=functions." + tool.name + " ", t_.constrain});
  return alts;
}

void HarmonyConstraint::literal_mask(std::string_view remaining, std::span<uint32_t> mask) const {
  const size_t n = std::min(remaining.size(), size_t(vocab_->max_token_bytes()));
  for (size_t len = 1; len <= n; ++len)
    if (auto id = vocab_->find(remaining.substr(0, len))) set_bit(mask, *id);
}

bool HarmonyConstraint::fill_mask(std::span<uint32_t> mask) {
  const State& s = state_;
  if (s.phase == Phase::Done) return false;
  if (s.phase == Phase::Content && s.channel == Channel::Analysis && budget_spent()) {
    set_bit(mask, t_.end);
    return true;
  }
  if (!enforcing()) return false;
  const auto& ordinary = vocab_->ordinary_mask();
  switch (s.phase) {
    case Phase::ExpectStart: set_bit(mask, t_.start); break;
    case Phase::Role: literal_mask(kAssistant.substr(s.text.size()), mask); break;
    case Phase::ExpectChannel: set_bit(mask, t_.channel); break;
    case Phase::Channel:
      for (const auto& [alt, terminator] : header_alternatives()) {
        if (alt.size() < s.text.size() || alt.compare(0, s.text.size(), s.text) != 0) continue;
        if (alt.size() == s.text.size())
          set_bit(mask, terminator);
        else
          literal_mask(std::string_view(alt).substr(s.text.size()), mask);
      }
      break;
    case Phase::ConstrainType:
      if (s.text == kJson)
        set_bit(mask, t_.message);
      else
        literal_mask(kJson.substr(s.text.size()), mask);
      break;
    case Phase::Content: {
      const int32_t terminator = s.channel == Channel::Analysis ? t_.end
                                 : s.channel == Channel::Call   ? t_.call
                                                                : t_.ret;
      if (matcher_) {
        matcher_->fill_mask(mask);
        if (matcher_->can_end()) set_bit(mask, terminator);
      } else {
        std::copy(ordinary.begin(), ordinary.end(), mask.begin());
        set_bit(mask, terminator);
      }
      break;
    }
    case Phase::Header:
    case Phase::Done: return false;
  }
  return true;
}

void HarmonyConstraint::enter_content(State& s, Channel channel, int32_t tool) {
  s.phase = Phase::Content;
  s.channel = channel;
  s.tool = tool;
  s.text.clear();
  s.matcher_steps = 0;
  matcher_.reset();
  if (!enforcing()) return;
  std::shared_ptr<const CompiledGrammar> g;
  if (channel == Channel::Final) g = spec_.final_format;
  if (channel == Channel::Call && tool >= 0) g = spec_.tools[size_t(tool)].arguments;
  if (g) matcher_.emplace(g);
}

bool HarmonyConstraint::accept_enforced(int32_t token, State& s) {
  const bool ordinary = token >= 0 && token < vocab_->size() && vocab_->ordinary(token);
  switch (s.phase) {
    case Phase::ExpectStart:
      if (token != t_.start) return false;
      s.phase = Phase::Role;
      s.text.clear();
      return true;
    case Phase::Role:
      if (!ordinary) return false;
      s.text += vocab_->bytes(token);
      if (!kAssistant.starts_with(s.text)) return false;
      if (s.text == kAssistant) {
        s.phase = Phase::ExpectChannel;
        s.text.clear();
      }
      return true;
    case Phase::ExpectChannel:
      if (token != t_.channel) return false;
      s.phase = Phase::Channel;
      s.text.clear();
      return true;
    case Phase::Channel: {
      const auto alts = header_alternatives();
      if (ordinary) {
        s.text += vocab_->bytes(token);
        return std::any_of(alts.begin(), alts.end(), [&](const auto& a) { return a.first.starts_with(s.text); });
      }
      for (size_t i = 0; i < alts.size(); ++i) {
        if (alts[i].first != s.text || alts[i].second != token) continue;
        if (token == t_.constrain) {
          // "commentary to=functions.NAME " -> the tool whose header this is
          for (size_t k = 0; k < spec_.tools.size(); ++k)
            if (s.text == "commentary to=functions." + spec_.tools[k].name + " ") s.tool = int32_t(k);
          s.phase = Phase::ConstrainType;
          s.text.clear();
          return true;
        }
        enter_content(s, s.text == "analysis" ? Channel::Analysis : Channel::Final, -1);
        if (s.channel == Channel::Final) s.forcing = false;  // the forced header is complete
        return true;
      }
      return false;
    }
    case Phase::ConstrainType:
      if (ordinary) {
        s.text += vocab_->bytes(token);
        return kJson.starts_with(s.text);
      }
      if (token != t_.message || s.text != kJson) return false;
      enter_content(s, Channel::Call, s.tool);
      return true;
    case Phase::Content: {
      if (s.channel == Channel::Analysis) {
        if (token == t_.end) {
          s.phase = Phase::ExpectStart;
          return true;
        }
        if (!ordinary || budget_spent()) return false;
        ++s.analysis_used;
        return true;
      }
      const int32_t terminator = s.channel == Channel::Call ? t_.call : t_.ret;
      if (token == terminator) {
        if (matcher_ && !matcher_->can_end()) return false;
        s.phase = Phase::Done;
        return true;
      }
      if (!ordinary) return false;
      if (matcher_) {
        if (!matcher_->accept_token(token)) return false;
        ++s.matcher_steps;
      }
      return true;
    }
    case Phase::Header:
    case Phase::Done: return true;
  }
  return false;
}

// The tolerant tracking of a passive constraint (the Harmony parser's rules, reduced to what the
// budget needs: which channel the content belongs to).
bool HarmonyConstraint::accept_passive(int32_t token, State& s) {
  const bool terminal = token == t_.ret || token == t_.call || token == t_.endoftext;
  switch (s.phase) {
    case Phase::Header:
      if (token == t_.start) {
        s.text.clear();
      } else if (token == t_.message) {
        const size_t at = s.text.find("<|channel|>");
        std::string name;
        if (at != std::string::npos)
          for (size_t i = at + 11; i < s.text.size() && !std::isspace(uint8_t(s.text[i])) && s.text[i] != '<'; ++i)
            name += s.text[i];
        enter_content(s,
                      name == "analysis" ? Channel::Analysis
                      : name == "final"  ? Channel::Final
                                         : Channel::Other,
                      -1);
      } else if (terminal) {
        s.phase = Phase::Done;
      } else if (token == t_.end) {
        s.text.clear();
      } else if (s.text.size() < kMaxPassiveHeader) {
        if (token == t_.channel)
          s.text += "<|channel|>";
        else if (token == t_.constrain)
          s.text += " <|constrain|>";
        else if (token >= 0 && token < vocab_->size() && vocab_->ordinary(token))
          s.text += vocab_->bytes(token);
      }
      return true;
    case Phase::Content:
      if (terminal) {
        s.phase = Phase::Done;
      } else if (token == t_.end) {
        if (s.channel == Channel::Analysis && budget_spent()) {
          s.forcing = true;  // the budget ended this analysis: force the final header
          s.phase = Phase::ExpectStart;
        } else {
          s.phase = Phase::Header;
          s.text.clear();
        }
      } else if (token == t_.start || token == t_.channel) {  // a new header cuts the message
        s.phase = Phase::Header;
        s.text = token == t_.channel ? "<|channel|>" : "";
      } else if (s.channel == Channel::Analysis) {
        if (budget_spent()) return false;
        ++s.analysis_used;
      }
      return true;
    default: return true;
  }
}

bool HarmonyConstraint::accept(int32_t token) {
  State next = state_;
  const bool ok = enforcing() ? accept_enforced(token, next) : accept_passive(token, next);
  if (!ok) {
    // A rejected step must not leave the matcher advanced (accept_token only advances on success;
    // nothing else touched it).
    return false;
  }
  history_.push_back(std::move(state_));
  state_ = std::move(next);
  return true;
}

void HarmonyConstraint::rollback(int n) {
  OSSRT_CHECK(n >= 0 && size_t(n) <= history_.size(), "harmony constraint: cannot roll back {} of {} tokens", n,
              history_.size());
  if (n == 0) return;
  const State& target = history_[history_.size() - size_t(n)];
  if (target.phase == Phase::Content && matcher_ &&
      (target.channel == Channel::Final || target.channel == Channel::Call))
    matcher_->rollback(state_.matcher_steps - target.matcher_steps);
  else
    matcher_.reset();
  state_ = target;
  history_.resize(history_.size() - size_t(n));
}

// ---------------------------------------------------------------------------------------------

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> end_tokens)
    : matcher_(std::move(grammar)), end_tokens_(std::move(end_tokens)) {}

bool GrammarConstraint::fill_mask(std::span<uint32_t> mask) {
  if (!ended_.empty() && ended_.back()) return false;
  matcher_.fill_mask(mask);
  if (matcher_.can_end())
    for (int32_t t : end_tokens_) set_bit(mask, t);
  return true;
}

bool GrammarConstraint::accept(int32_t token) {
  const bool ended = !ended_.empty() && ended_.back();
  if (!ended) {
    if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) {
      if (!matcher_.can_end()) return false;
      ended_.push_back(true);
      return true;
    }
    if (!matcher_.accept_token(token)) return false;
  }
  ended_.push_back(ended);
  return true;
}

void GrammarConstraint::rollback(int n) {
  OSSRT_CHECK(n >= 0 && size_t(n) <= ended_.size(), "grammar constraint: cannot roll back {} of {} tokens", n,
              ended_.size());
  for (int i = 0; i < n; ++i) {
    const bool was_ended = ended_.back();
    ended_.pop_back();
    if (!was_ended) matcher_.rollback(1);  // a grammar step (end tokens and later ones are not)
  }
}

}  // namespace ossrt::structured
