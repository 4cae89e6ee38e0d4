#pragma once
// Token-id lists as JSON arrays (what `ossrt tokenize` and `render --ids` print, and what
// `generate`, `logits`, `detokenize` and `parse` read). One reader, so every command rejects a bad
// file the same way; each command states which ids it accepts.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ossrt {

struct TokenIdRange {
  int64_t min = 0;                                 // smallest accepted id
  int64_t max_exclusive = int64_t(INT32_MAX) + 1;  // ids must be < this (and fit int32)
  bool allow_empty = false;
};

// Every element must be an integer in the range; throws ossrt::Error naming `source` and the index.
std::vector<int32_t> token_ids_from_json(const nlohmann::json& doc, const std::string& source,
                                         const TokenIdRange& range);
// Reads and parses `path` (a JSON array); throws ossrt::Error on a missing file or bad JSON.
std::vector<int32_t> read_token_ids_file(const std::string& path, const TokenIdRange& range);

}  // namespace ossrt
