#pragma once
// Lenient parsing of one Harmony message header (the text between <|start|> and <|message|>,
// special tokens spelled out). Internal to the parser; split out so it is tested on its own.
#include <optional>
#include <string>
#include <string_view>

#include "harmony/conversation.h"
#include "harmony/parser.h"

namespace ossrt::harmony {

struct HeaderParse {
  MessageStart start;
  RecipientPlacement placement = RecipientPlacement::Auto;
  // Things a well-formed header does not have (missing role or channel, unknown channel, junk
  // words, repeated markers). The header is still used; the parser counts it as one recovery.
  int anomalies = 0;
};

// docs/reference/SPEC.md 5.9 header rules, made total: every input yields fields, never an error.
//  - `<|channel|>NAME` anywhere sets the channel (NAME ends at whitespace or '<'); a known
//    channel embedded in junk ("––commentary") is recovered; an unknown one becomes "".
//  - `to=X` sets the recipient wherever it appears; `<|constrain|>T` sets the content type.
//  - Otherwise harmony's rule: a lone bare word is the recipient, two bare words are
//    recipient + content type; further words are junk.
//  - Without `preset`, the first word is the role; an unknown first word is a tool name.
HeaderParse parse_header(std::string_view header, std::optional<Role> preset);

// For a header that never reached <|message|>: its channel (if it named a known one) and the rest
// of its text with special-token spellings removed, to be shown as content.
struct SalvagedHeader {
  std::string channel;
  std::string text;
};
// `opened_by_start`: the header followed an explicit <|start|>, so a leading role word
// ("assistant") is the role, not text.
SalvagedHeader salvage_header(std::string_view header, bool opened_by_start = false);

// "analysis" | "commentary" | "final" if `word` is one or contains exactly one of them; else "".
std::string normalize_channel(std::string_view word);

}  // namespace ossrt::harmony
