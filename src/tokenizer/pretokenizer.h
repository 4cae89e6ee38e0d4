#pragma once
// The Split pre-tokenizer of tokenizer.json (behaviour "Isolated": every match and every gap
// between matches is a piece), run by PCRE2 with its JIT.
//
// The pattern is written for the Rust engines the references use (Oniguruma in HF tokenizers,
// fancy-regex in tiktoken), where `\s` means the Unicode White_Space property. PCRE2's `\s` under
// UCP is a different set (it adds U+180E), so `\s`/`\S` are rewritten to \p{White_Space} /
// \P{White_Space} before compiling; everything else is passed through unchanged.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::tokenizer_detail {

class PreTokenizer {
 public:
  // Throws ossrt::Error with PCRE2's message and offset when the pattern does not compile.
  explicit PreTokenizer(const std::string& pattern);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits `text`, which MUST be valid UTF-8 (the caller validates; PCRE2 runs without its own
  // check for speed), into pieces appended to `pieces` as views into `text`.
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

  // The pattern after the `\s` rewrite (what PCRE2 compiled), for diagnostics and tests.
  const std::string& compiled_pattern() const { return compiled_pattern_; }

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
  std::string compiled_pattern_;
};

// Exposed for tests: the `\s` -> \p{White_Space} rewrite.
std::string rewrite_whitespace_classes(const std::string& pattern);

}  // namespace ossrt::tokenizer_detail
