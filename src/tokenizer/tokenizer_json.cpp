// Loading a Hugging Face tokenizer.json into TokenizerImpl. Only the shape gpt-oss uses is
// accepted (BPE + Split regex + ByteLevel, no normalizer); anything else is refused with a
// message, because silently ignoring an option would produce different ids than the reference.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace ossrt {
namespace {

using nlohmann::json;
using tokenizer_detail::Merge;

struct Context {
  const std::string& path;
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) const {
    fail("tokenizer {}: {}", path, fmt::format(f, std::forward<Args>(args)...));
  }
  const json& field(const json& obj, const char* key, const char* where) const {
    if (!obj.is_object() || !obj.contains(key)) error("{} has no \"{}\"", where, key);
    return obj.at(key);
  }
  std::string string_field(const json& obj, const char* key, const char* where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) error("{}.{} is not a string", where, key);
    return v.get<std::string>();
  }
  bool bool_field_or(const json& obj, const char* key, bool fallback, const char* where) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_boolean()) error("{}.{} is not a boolean", where, key);
    return obj.at(key).get<bool>();
  }
};

json read_json(const Context& ctx) {
  std::ifstream in(ctx.path, std::ios::binary);
  if (!in) ctx.error("cannot open the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  json doc = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) ctx.error("not valid JSON");
  if (!doc.is_object()) ctx.error("the top level is not a JSON object");
  return doc;
}

// Returns the Split regex; checks that the rest of the pipeline is what this tokenizer implements.
std::string read_pre_tokenizer(const Context& ctx, const json& doc) {
  if (doc.contains("normalizer") && !doc.at("normalizer").is_null()) {
    ctx.error("normalizer {} is not supported (gpt-oss has none)", doc.at("normalizer").dump().substr(0, 80));
  }
  const json& pre = ctx.field(doc, "pre_tokenizer", "tokenizer.json");
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    const json& list = ctx.field(pre, "pretokenizers", "pre_tokenizer");
    if (!list.is_array()) ctx.error("pre_tokenizer.pretokenizers is not an array");
    steps.assign(list.begin(), list.end());
  } else {
    steps.push_back(pre);
  }
  std::string pattern;
  bool byte_level = false;
  for (const json& step : steps) {
    const std::string type = ctx.string_field(step, "type", "pre_tokenizer step");
    if (type == "Split") {
      if (!pattern.empty()) ctx.error("more than one Split pre-tokenizer is not supported");
      const json& pat = ctx.field(step, "pattern", "Split pre-tokenizer");
      if (!pat.contains("Regex") || !pat.at("Regex").is_string()) ctx.error("Split pattern has no \"Regex\" string");
      pattern = pat.at("Regex").get<std::string>();
      if (pattern.empty()) ctx.error("Split pattern is empty");
      const std::string behavior = ctx.string_field(step, "behavior", "Split pre-tokenizer");
      if (behavior != "Isolated") ctx.error("Split behavior \"{}\" is not supported (only Isolated)", behavior);
      if (ctx.bool_field_or(step, "invert", false, "Split pre-tokenizer"))
        ctx.error("Split invert=true is not supported");
    } else if (type == "ByteLevel") {
      if (ctx.bool_field_or(step, "add_prefix_space", false, "ByteLevel")) {
        ctx.error("ByteLevel add_prefix_space=true is not supported");
      }
      if (ctx.bool_field_or(step, "use_regex", true, "ByteLevel")) {
        ctx.error("ByteLevel use_regex=true is not supported (the Split regex must do the splitting)");
      }
      byte_level = true;
    } else {
      ctx.error("pre-tokenizer type \"{}\" is not supported", type);
    }
  }
  if (pattern.empty()) ctx.error("no Split pre-tokenizer with a Regex");
  if (!byte_level) ctx.error("no ByteLevel pre-tokenizer");
  return pattern;
}

void read_vocab(const Context& ctx, const json& model, TokenizerImpl& impl) {
  const json& vocab = ctx.field(model, "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) ctx.error("model.vocab is not a non-empty object");
  const auto count = static_cast<int32_t>(vocab.size());
  impl.vocab.regular_count = count;
  impl.vocab.token_bytes.assign(static_cast<size_t>(count), std::string());
  std::vector<bool> seen(static_cast<size_t>(count), false);
  for (const auto& [spelled, id_json] : vocab.items()) {
    if (!id_json.is_number_integer()) ctx.error("model.vocab[\"{}\"] is not an integer id", spelled);
    const auto id = id_json.get<int64_t>();
    // Dense ids let token_bytes be a plain vector indexed by id.
    if (id < 0 || id >= count) ctx.error("model.vocab id {} of \"{}\" is outside 0..{}", id, spelled, count - 1);
    if (seen[id]) ctx.error("model.vocab id {} appears twice", id);
    seen[id] = true;
    auto bytes = byte_level::to_bytes(spelled);
    if (!bytes) ctx.error("model.vocab entry \"{}\" is not in the ByteLevel alphabet", spelled);
    impl.vocab.token_bytes[id] = std::move(*bytes);
  }
  impl.vocab.byte_token.fill(-1);
  for (int32_t id = 0; id < count; ++id) {
    const std::string& b = impl.vocab.token_bytes[id];
    if (b.empty()) ctx.error("model.vocab id {} is an empty token", id);
    if (b.size() == 1) impl.vocab.byte_token[static_cast<uint8_t>(b[0])] = id;
  }
  for (int b = 0; b < 256; ++b) {
    if (impl.vocab.byte_token[b] < 0) ctx.error("model.vocab has no token for byte 0x{:02X}", b);
  }
}

void read_merges(const Context& ctx, const json& model, TokenizerImpl& impl) {
  const json& merges = ctx.field(model, "merges", "model");
  if (!merges.is_array()) ctx.error("model.merges is not an array");
  impl.vocab.merges.reserve(merges.size());
  std::string left_spelled, right_spelled;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    // tokenizers >= 0.20 writes [left, right]; older files write "left right".
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left_spelled = m[0].get<std::string>();
      right_spelled = m[1].get<std::string>();
    } else if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos) ctx.error("model.merges[{}] \"{}\" has no space", rank, s);
      left_spelled = s.substr(0, space);
      right_spelled = s.substr(space + 1);
    } else {
      ctx.error("model.merges[{}] is neither [left, right] nor \"left right\"", rank);
    }
    const auto left = byte_level::to_bytes(left_spelled);
    const auto right = byte_level::to_bytes(right_spelled);
    if (!left || !right) ctx.error("model.merges[{}] is not in the ByteLevel alphabet", rank);
    const int32_t left_id = impl.vocab.pieces.find(*left);
    const int32_t right_id = impl.vocab.pieces.find(*right);
    const int32_t merged_id = impl.vocab.pieces.find(*left + *right);
    if (left_id < 0 || right_id < 0 || merged_id < 0) {
      ctx.error("model.merges[{}] (\"{}\", \"{}\") uses a token missing from model.vocab", rank, left_spelled,
                right_spelled);
    }
    impl.vocab.merges.insert_or_assign(left_id, right_id, Merge{static_cast<int32_t>(rank), merged_id});
  }
}

void check_bpe_options(const Context& ctx, const json& model, TokenizerImpl& impl) {
  const std::string type = ctx.string_field(model, "type", "model");
  if (type != "BPE") ctx.error("model.type \"{}\" is not supported (only BPE)", type);
  for (const char* key : {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      ctx.error("model.{} = {} is not supported", key, model.at(key).dump());
    }
  }
  if (ctx.bool_field_or(model, "byte_fallback", false, "model")) ctx.error("model.byte_fallback=true is not supported");
  impl.vocab.ignore_merges = ctx.bool_field_or(model, "ignore_merges", false, "model");
}

// Bounds the id table a hostile file could make us allocate; far above any real vocabulary.
constexpr int64_t kMaxTokenId = 1 << 22;

std::string reserved_text(int32_t id) { return fmt::format("<|reserved_{}|>", id); }

void read_added_tokens(const Context& ctx, const json& doc, TokenizerImpl& impl) {
  const int32_t regular = impl.vocab.regular_count;
  int32_t max_id = regular - 1;
  std::vector<std::pair<int32_t, std::string>> added;
  if (doc.contains("added_tokens") && !doc.at("added_tokens").is_null()) {
    const json& list = doc.at("added_tokens");
    if (!list.is_array()) ctx.error("added_tokens is not an array");
    for (const json& t : list) {
      const json& id_json = ctx.field(t, "id", "added_tokens[]");
      if (!id_json.is_number_integer()) ctx.error("added_tokens[].id is not an integer");
      const auto id = id_json.get<int64_t>();
      const std::string content = ctx.string_field(t, "content", "added_tokens[]");
      // Added tokens that shadow a BPE id would need HF's re-numbering rules; gpt-oss has none.
      if (id < regular || id >= kMaxTokenId) {
        ctx.error("added token \"{}\" has id {}, expected {}..", content, id, regular);
      }
      if (content.empty()) ctx.error("added token {} has empty content", id);
      added.emplace_back(static_cast<int32_t>(id), content);
      max_id = std::max<int32_t>(max_id, static_cast<int32_t>(id));
    }
  }
  impl.defined_count = max_id + 1;
  impl.vocab_size = std::max(impl.defined_count, kGptOssEmbeddingRows);
  impl.vocab.token_bytes.resize(static_cast<size_t>(impl.vocab_size));
  impl.special.assign(static_cast<size_t>(impl.vocab_size), false);
  std::vector<bool> listed(static_cast<size_t>(impl.vocab_size), false);
  for (auto& [id, content] : added) {
    if (listed[id]) ctx.error("added token id {} appears twice", id);
    if (impl.special_ids.contains(content)) ctx.error("added token \"{}\" appears twice", content);
    listed[id] = true;
    impl.vocab.token_bytes[id] = content;
    impl.special[id] = true;
    impl.special_ids.emplace(content, id);
    impl.added_tokens_longest_first.emplace_back(content, id);
    impl.added_token_first_byte[static_cast<uint8_t>(content[0])] = true;
  }
  // Every id the model can emit but the file does not name is reserved (harmony's convention).
  for (int32_t id = regular; id < impl.vocab_size; ++id) {
    if (listed[id]) continue;
    impl.vocab.token_bytes[id] = reserved_text(id);
    impl.special[id] = true;
    impl.special_ids.emplace(impl.vocab.token_bytes[id], id);
  }
  std::stable_sort(impl.added_tokens_longest_first.begin(), impl.added_tokens_longest_first.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

}  // namespace

std::unique_ptr<TokenizerImpl> load_tokenizer_json(const std::string& path) {
  const Context ctx{path};
  const json doc = read_json(ctx);
  auto impl = std::make_unique<TokenizerImpl>();
  const json& model = ctx.field(doc, "model", "tokenizer.json");
  check_bpe_options(ctx, model, *impl);
  read_vocab(ctx, model, *impl);
  // The piece table keeps a pointer to the token_bytes vector (not to its elements), so the
  // resize in read_added_tokens does not invalidate it.
  impl->vocab.pieces.build(impl->vocab.token_bytes, impl->vocab.regular_count);
  read_merges(ctx, model, *impl);
  read_added_tokens(ctx, doc, *impl);
  for (int32_t id = 0; id < impl->vocab.regular_count; ++id)
    impl->max_token_bytes = std::max(impl->max_token_bytes, impl->vocab.token_bytes[size_t(id)].size());
  for (const auto& [content, id] : impl->added_tokens_longest_first)
    impl->max_token_bytes = std::max(impl->max_token_bytes, content.size());
  const std::string pattern = read_pre_tokenizer(ctx, doc);
  try {
    impl->pre_tokenizer = std::make_unique<tokenizer_detail::PreTokenizer>(pattern);
  } catch (const Error& e) {
    ctx.error("{}", e.what());  // the same message, with the file named
  }
  return impl;
}

}  // namespace ossrt
