#pragma once
// Regular expressions (the ECMAScript syntax JSON Schema's `pattern` uses, which also covers
// vLLM's guided_regex) compiled into grammar nodes.
//
// Supported: literals, `.`, classes `[...]` / `[^...]` with ranges, `\d \D \w \W \s \S`, escapes
// `\n \r \t \f \v \0 \cX \xHH \uHHHH \u{H...}` and escaped punctuation, groups `(...)`, `(?:...)`,
// `(?<name>...)`, alternation, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms too: laziness does
// not change the language), and `^` / `$` at the start / end of a top-level alternative.
// Refused with the position: backreferences, lookaround, word boundaries, Unicode property
// escapes, flags, and anchors anywhere else. A quantifier bound above kMaxRegexRepeat is refused.
#include <cstdint>
#include <string_view>

#include "structured/charset.h"
#include "structured/grammar.h"

namespace ossrt::structured {

inline constexpr int32_t kMaxRegexRepeat = 10'000;

struct RegexOptions {
  CharSpelling spelling = CharSpelling::Utf8;
  // false: the whole text must match (^ and $ are implied; guided_regex).
  // true: JSON Schema search semantics: an alternative without ^ may have anything before it, one
  // without $ anything after it.
  bool search = false;
};

// Throws StructuredError("position N", ...) for invalid or unsupported syntax.
int32_t compile_regex(Grammar& g, std::string_view pattern, const RegexOptions& options);

}  // namespace ossrt::structured
