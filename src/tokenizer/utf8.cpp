#include "tokenizer/utf8.h"

namespace ossrt::utf8 {
namespace {

// The allowed range of the second byte depends on the lead byte (this is what rules out
// overlongs, surrogates and code points above U+10FFFF); later continuation bytes are 80..BF.
struct LeadInfo {
  uint8_t length;  // 0: never valid as a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

constexpr LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};  // continuation byte or overlong 2-byte lead
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes UTF-16 surrogates D800..DFFF
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

}  // namespace

Sequence classify(std::string_view bytes, size_t pos) {
  const auto lead = static_cast<uint8_t>(bytes[pos]);
  const LeadInfo info = lead_info(lead);
  if (info.length == 0) return {SequenceKind::kInvalid, 1};
  if (info.length == 1) return {SequenceKind::kComplete, 1};
  uint8_t matched = 1;
  for (; matched < info.length; ++matched) {
    if (pos + matched >= bytes.size()) return {SequenceKind::kTruncated, matched};
    const auto b = static_cast<uint8_t>(bytes[pos + matched]);
    const uint8_t lo = matched == 1 ? info.second_lo : 0x80;
    const uint8_t hi = matched == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return {SequenceKind::kInvalid, matched};
  }
  return {SequenceKind::kComplete, info.length};
}

size_t valid_prefix_length(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    // ASCII fast path: most text is mostly ASCII.
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Sequence seq = classify(bytes, pos);
    if (seq.kind != SequenceKind::kComplete) return pos;
    pos += seq.length;
  }
  return pos;
}

size_t append_repaired(std::string_view bytes, bool at_end, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t valid = valid_prefix_length(bytes.substr(pos));
    out.append(bytes.substr(pos, valid));
    pos += valid;
    if (pos == bytes.size()) break;
    const Sequence seq = classify(bytes, pos);
    if (seq.kind == SequenceKind::kTruncated && !at_end) return seq.length;
    out.append(kReplacement);
    pos += seq.length;
  }
  return 0;
}

}  // namespace ossrt::utf8
