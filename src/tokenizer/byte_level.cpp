#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace ossrt::byte_level {
namespace {

struct Alphabet {
  std::array<char32_t, 256> code_point_of_byte{};
  // Every code point of the alphabet is below U+0144 (256 + 68), so a flat table inverts it.
  static constexpr char32_t kLimit = 0x144;
  std::array<int, kLimit> byte_of_code_point{};

  Alphabet() {
    byte_of_code_point.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : next_extra++;
      code_point_of_byte[b] = cp;
      byte_of_code_point[cp] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

void append_utf8(char32_t cp, std::string& out) {
  // Only code points below U+0800 occur in this alphabet: one or two bytes.
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

char32_t code_point_for_byte(unsigned char byte) { return alphabet().code_point_of_byte[byte]; }

std::optional<std::string> to_bytes(std::string_view spelled) {
  if (!utf8::is_valid(spelled)) return std::nullopt;
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(spelled.size());
  for (size_t i = 0; i < spelled.size();) {
    const auto b0 = static_cast<unsigned char>(spelled[i]);
    char32_t cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0) {
      cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are outside the alphabet
    }
    if (cp >= Alphabet::kLimit || a.byte_of_code_point[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(a.byte_of_code_point[cp]));
  }
  return out;
}

std::string to_spelling(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(alphabet().code_point_of_byte[b], out);
  return out;
}

}  // namespace ossrt::byte_level
