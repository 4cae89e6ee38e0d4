// `ossrt parse`: the Harmony messages in a completion (the token ids sampled after
// `<|start|>assistant`), as JSON, with how each message ended and the recoveries the tolerant
// parser made. For debugging what a model emitted and what the server made of it.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/token_ids_file.h"
#include "harmony/parser.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {
namespace {

struct ParseCommandOptions {
  std::string ids_file;
  std::string tokenizer;
  bool from_start = false;
};

// Accepts a JSON array of ids (what `ossrt tokenize` / `render --ids` print) or whitespace- or
// comma-separated integers.
std::vector<int32_t> read_ids_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const auto doc = nlohmann::json::parse(text, nullptr, false);
  std::vector<int32_t> ids;
  if (doc.is_array()) return token_ids_from_json(doc, path, {.min = INT32_MIN, .allow_empty = true});
  for (char& c : text) {
    if (c == ',') c = ' ';
  }
  std::istringstream words(text);
  std::string word;
  while (words >> word) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || value < INT32_MIN || value > INT32_MAX) {
      fail("{}: '{}' is not a 32-bit integer id", path, word);
    }
    ids.push_back(static_cast<int32_t>(value));
  }
  return ids;
}

nlohmann::ordered_json message_json(const harmony::ParsedMessage& m) {
  nlohmann::ordered_json out;
  out["role"] = harmony::role_name(m.role);
  if (!m.author.empty()) out["author"] = m.author;
  out["channel"] = m.channel;
  out["recipient"] = m.recipient;
  out["content_type"] = m.content_type;
  out["content"] = m.content;
  out["ended_by"] = harmony::terminator_name(m.terminator);
  return out;
}

void run_parse(const ParseCommandOptions& opt) {
  const std::vector<int32_t> ids = read_ids_file(opt.ids_file);
  const auto tok = Tokenizer::load(opt.tokenizer.empty() ? default_tokenizer_path() : opt.tokenizer);
  const std::optional<harmony::Role> initial =
      opt.from_start ? std::nullopt : std::optional<harmony::Role>(harmony::Role::Assistant);
  const harmony::ParseResult result = harmony::parse_completion(tok, ids, initial);
  nlohmann::ordered_json out;
  out["messages"] = nlohmann::ordered_json::array();
  for (const auto& m : result.messages) out["messages"].push_back(message_json(m));
  const harmony::RecoveryCounts& r = result.recoveries;
  out["recoveries"] = {{"missing_start", r.missing_start},
                       {"header_not_closed", r.header_not_closed},
                       {"header_too_long", r.header_too_long},
                       {"malformed_header", r.malformed_header},
                       {"unterminated_message", r.unterminated_message},
                       {"stray_special", r.stray_special},
                       {"total", r.total()},
                       {"cut_at_finish", r.cut_at_finish}};
  std::cout << out.dump(2) << "\n";
}

void setup_parse(CLI::App& app) {
  auto opt = std::make_shared<ParseCommandOptions>();
  CLI::App* cmd =
      app.add_subcommand("parse", "Parse the Harmony messages of a completion (token ids after <|start|>assistant)");
  cmd->add_option("--ids-file", opt->ids_file, "token ids: a JSON array or whitespace-separated")->required();
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json (default: the bundled gpt-oss one)");
  cmd->add_flag("--from-start", opt->from_start,
                "the ids begin with <|start|> (a whole rendered conversation), not inside a header");
  cmd->callback([opt] { run_parse(*opt); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_parse);

}  // namespace ossrt::tools
