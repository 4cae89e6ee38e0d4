#include "core/token_ids_file.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"

namespace ossrt {

std::vector<int32_t> token_ids_from_json(const nlohmann::json& doc, const std::string& source,
                                         const TokenIdRange& range) {
  OSSRT_CHECK(doc.is_array(), "{}: expected a JSON array of token ids", source);
  OSSRT_CHECK(range.allow_empty || !doc.empty(), "{}: expected a non-empty JSON array of token ids", source);
  std::vector<int32_t> ids;
  ids.reserve(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    OSSRT_CHECK(doc[i].is_number_integer(), "{}: element {} is not an integer", source, i);
    const int64_t id = doc[i].get<int64_t>();
    OSSRT_CHECK(id >= range.min && id < range.max_exclusive && id >= INT32_MIN && id <= INT32_MAX,
                "{}: token id {} at index {} is outside [{}, {})", source, id, i, range.min, range.max_exclusive);
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<int32_t> read_token_ids_file(const std::string& path, const TokenIdRange& range) {
  std::ifstream f(path);
  OSSRT_CHECK(f.good(), "cannot open token ids file {}", path);
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  return token_ids_from_json(doc, path, range);
}

}  // namespace ossrt
