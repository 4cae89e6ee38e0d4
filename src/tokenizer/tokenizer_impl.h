#pragma once
// The state behind ossrt::Tokenizer, shared by the loader (tokenizer_json.cpp) and the
// encode/decode code (tokenizer.cpp). Immutable after load.
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"

namespace ossrt {

// The model's embedding rows: a random-weight or misbehaving model may emit any id below this, so
// every such id needs a text. tokenizer.json cannot tell us this number; docs/reference/SPEC.md section 4 does.
inline constexpr int32_t kGptOssEmbeddingRows = 201088;

class TokenizerImpl {
 public:
  tokenizer_detail::BpeVocab vocab;  // token_bytes covers every id below vocab_size
  std::unique_ptr<tokenizer_detail::PreTokenizer> pre_tokenizer;
  int32_t defined_count = 0;  // 1 + the largest id tokenizer.json lists
  int32_t vocab_size = 0;
  std::vector<bool> special;  // per id: added token or reserved (not plain BPE)
  // Special text -> id: every added token and every synthesized "<|reserved_N|>".
  std::unordered_map<std::string, int32_t> special_ids;
  // Added tokens in the order encode_with_special tries them: longest content first, so the
  // longest spelling wins at a position (as in the reference DictionarySplitter).
  std::vector<std::pair<std::string, int32_t>> added_tokens_longest_first;
  bool added_token_first_byte[256] = {};
  size_t max_token_bytes = 1;  // the longest token's byte length (plain BPE and added tokens)

  // Ordinary encoding of text that may hold invalid UTF-8. With a `limit`, stops and returns false
  // as soon as `out` is known to end up longer than `limit` (what is in `out` then is partial).
  bool encode_ordinary(std::string_view text, std::vector<int32_t>& out,
                       size_t limit = std::numeric_limits<size_t>::max()) const;
  // Whether `bytes` more bytes are sure to take `out` past `limit` (each token is at most
  // max_token_bytes long): then they need not be encoded to know the answer.
  bool surely_exceeds(size_t out_size, size_t bytes, size_t limit) const {
    return limit != std::numeric_limits<size_t>::max() &&
           out_size + (bytes + max_token_bytes - 1) / max_token_bytes > limit;
  }
};

// Builds the impl from the file; throws ossrt::Error naming the file and what is wrong.
std::unique_ptr<TokenizerImpl> load_tokenizer_json(const std::string& path);

}  // namespace ossrt
