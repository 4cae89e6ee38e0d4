#pragma once
// UTF-8 well-formedness per Unicode Table 3-7 (no overlongs, no surrogates, nothing above
// U+10FFFF). Used on both sides of the tokenizer: encode() must find invalid bytes before handing
// text to PCRE2 (whose no-check mode is undefined on invalid input), and decoding must turn model
// output, which can be any byte sequence, into valid UTF-8 without ever splitting a character.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ossrt::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// What starts at bytes[pos]:
//   kComplete:  a well-formed character of `length` bytes;
//   kTruncated: the remaining `length` bytes are a well-formed prefix that more bytes could
//               complete (only possible when the sequence reaches the end of the input);
//   kInvalid:   a maximal ill-formed subpart of `length` (>= 1) bytes; it becomes one U+FFFD.
enum class SequenceKind : uint8_t { kComplete, kTruncated, kInvalid };
struct Sequence {
  SequenceKind kind;
  uint8_t length;
};
Sequence classify(std::string_view bytes, size_t pos);

// Length of the longest well-formed prefix of `bytes` (== bytes.size() when all valid).
size_t valid_prefix_length(std::string_view bytes);

inline bool is_valid(std::string_view bytes) { return valid_prefix_length(bytes) == bytes.size(); }

// Appends `bytes` to `out` with each maximal ill-formed subpart replaced by U+FFFD (the
// "substitution of maximal subparts" practice of Unicode ch. 3, also what WHATWG decoders do).
// With `at_end == false` a trailing kTruncated prefix is not emitted; its length is returned so a
// streaming caller can keep it for the next chunk. With `at_end == true` it becomes U+FFFD and 0
// is returned.
size_t append_repaired(std::string_view bytes, bool at_end, std::string& out);

}  // namespace ossrt::utf8
