#pragma once
// The ByteLevel alphabet of GPT-2 style tokenizers: tokenizer.json spells every token's raw bytes
// as printable code points (byte 0x20 ' ' is 'Ġ' U+0120, byte 0x0A is 'Ċ' U+010A, ...), so the
// vocabulary and merges must be mapped back to bytes before BPE can run on raw UTF-8.
#include <optional>
#include <string>
#include <string_view>

namespace ossrt::byte_level {

// The printable code point standing for `byte` (bytes that are already printable Latin-1 stand
// for themselves; the other 68 take U+0100.. in byte order).
char32_t code_point_for_byte(unsigned char byte);

// Maps a ByteLevel-spelled token (UTF-8) back to its raw bytes; nullopt when the string is not
// valid UTF-8 or uses a code point outside the 256-symbol alphabet.
std::optional<std::string> to_bytes(std::string_view spelled);

// The inverse: raw bytes -> ByteLevel spelling (UTF-8). Used by tests and diagnostics.
std::string to_spelling(std::string_view bytes);

}  // namespace ossrt::byte_level
