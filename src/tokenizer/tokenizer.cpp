#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace ossrt {
namespace {

const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

}  // namespace

bool TokenizerImpl::encode_ordinary(std::string_view text, std::vector<int32_t>& out, size_t limit) const {
  if (surely_exceeds(out.size(), text.size(), limit)) return false;
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);  // ~4 bytes per piece on typical text
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t valid = utf8::valid_prefix_length(text.substr(pos));
    if (valid > 0) {
      pieces.clear();
      pre_tokenizer->split(text.substr(pos, valid), pieces);
      for (std::string_view piece : pieces) {
        tokenizer_detail::encode_piece(vocab, piece, out);
        if (out.size() > limit) return false;
      }
      pos += valid;
    }
    if (pos == text.size()) break;
    // Invalid UTF-8 cannot go to PCRE2 (its no-check mode is undefined on it, and the reference
    // tokenizers only ever see valid strings). Each byte of the ill-formed subpart becomes its
    // own single-byte token, so the bytes survive exactly: concatenated token_bytes == text.
    const utf8::Sequence bad = utf8::classify(text, pos);
    for (size_t i = 0; i < bad.length; ++i) out.push_back(vocab.byte_token[static_cast<uint8_t>(text[pos + i])]);
    pos += bad.length;
    if (out.size() > limit) return false;
  }
  return true;
}

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& tokenizer_json_path) {
  return std::shared_ptr<const Tokenizer>(new Tokenizer(load_tokenizer_json(tokenizer_json_path)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);  // ~4 bytes per token on English text; avoids most regrowth
  impl_->encode_ordinary(text, ids);
  return ids;
}

std::optional<std::vector<int32_t>> Tokenizer::encode_at_most(std::string_view text, size_t max_tokens) const {
  if (impl_->surely_exceeds(0, text.size(), max_tokens)) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(std::min(text.size() / 3 + 4, max_tokens + 1));
  if (!impl_->encode_ordinary(text, ids, max_tokens)) return std::nullopt;
  return ids;
}

namespace {

// encode_with_special's splitting, with a token limit (SIZE_MAX: none).
bool encode_special_into(const TokenizerImpl& impl, std::string_view text, std::vector<int32_t>& ids, size_t limit) {
  // Earliest occurrence wins; at one position the longest spelling wins.
  size_t segment_start = 0;
  for (size_t i = 0; i < text.size();) {
    if (!impl.added_token_first_byte[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    const std::pair<std::string, int32_t>* match = nullptr;
    for (const auto& candidate : impl.added_tokens_longest_first) {
      if (text.substr(i).starts_with(candidate.first)) {
        match = &candidate;
        break;
      }
    }
    if (!match) {
      ++i;
      continue;
    }
    if (!impl.encode_ordinary(text.substr(segment_start, i - segment_start), ids, limit)) return false;
    ids.push_back(match->second);
    if (ids.size() > limit) return false;
    i += match->first.size();
    segment_start = i;
  }
  return impl.encode_ordinary(text.substr(segment_start), ids, limit);
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_special_into(*impl_, text, ids, std::numeric_limits<size_t>::max());
  return ids;
}

std::optional<std::vector<int32_t>> Tokenizer::encode_with_special_at_most(std::string_view text,
                                                                           size_t max_tokens) const {
  if (impl_->surely_exceeds(0, text.size(), max_tokens)) return std::nullopt;
  std::vector<int32_t> ids;
  ids.reserve(std::min(text.size() / 3 + 4, max_tokens + 1));
  if (!encode_special_into(*impl_, text, ids, max_tokens)) return std::nullopt;
  return ids;
}

size_t Tokenizer::max_token_bytes() const { return impl_->max_token_bytes; }

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size) return empty_string();
  return impl_->vocab.token_bytes[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[static_cast<size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view special_text) const {
  const auto it = impl_->special_ids.find(std::string(special_text));
  if (it == impl_->special_ids.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);  // out-of-range ids add nothing
  std::string text;
  text.reserve(bytes.size());
  utf8::append_repaired(bytes, /*at_end=*/true, text);
  return text;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t Tokenizer::defined_token_count() const { return impl_->defined_count; }

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {
  OSSRT_CHECK(tok_ != nullptr, "IncrementalDecoder: null tokenizer");
}

std::string IncrementalDecoder::push(int32_t id) {
  const std::string& bytes = tok_->token_bytes(id);
  std::string out;
  if (pending_.empty()) {
    // Common case: a token that is whole characters on its own passes straight through.
    if (utf8::is_valid(bytes)) return bytes;
    const size_t keep = utf8::append_repaired(bytes, /*at_end=*/false, out);
    pending_.assign(bytes, bytes.size() - keep, keep);
    return out;
  }
  pending_ += bytes;
  const size_t keep = utf8::append_repaired(pending_, /*at_end=*/false, out);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8::append_repaired(pending_, /*at_end=*/true, out);
  pending_.clear();
  return out;
}

std::string default_tokenizer_path() {
  if (const char* env = std::getenv("OSSRT_TOKENIZER"); env && *env) return env;
  const std::filesystem::path bundled = std::filesystem::path(OSSRT_SOURCE_DIR) / "third_party" / "npm" /
                                        "node_modules" / "@lenml" / "tokenizer-gptoss" / "models" / "tokenizer.json";
  if (std::filesystem::exists(bundled)) return bundled.string();
  fail(
      "no tokenizer: $OSSRT_TOKENIZER is not set and {} does not exist (run scripts/install-deps.sh, "
      "or pass --tokenizer PATH)",
      bundled.string());
}

}  // namespace ossrt
