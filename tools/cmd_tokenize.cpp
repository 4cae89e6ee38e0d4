// `ossrt tokenize` and `ossrt detokenize`: the tokenizer from the command line, for checking a
// prompt's ids by hand and for scripts that compare against other tokenizers.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/token_ids_file.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text_file;
  bool allow_special = false;
};

struct DetokenizeOptions {
  std::string tokenizer;
  std::string ids_file;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& path) {
  return Tokenizer::load(path.empty() ? default_tokenizer_path() : path);
}

void run_tokenize(const TokenizeOptions& opt) {
  const auto tok = load_tokenizer(opt.tokenizer);
  const std::string text = read_file(opt.text_file);
  const std::vector<int32_t> ids = opt.allow_special ? tok->encode_with_special(text) : tok->encode(text);
  std::cout << nlohmann::json(ids).dump() << "\n";
}

void run_detokenize(const DetokenizeOptions& opt) {
  const auto tok = load_tokenizer(opt.tokenizer);
  const nlohmann::json doc = nlohmann::json::parse(read_file(opt.ids_file), nullptr, false);
  const std::vector<int32_t> ids = token_ids_from_json(doc, opt.ids_file, {.min = INT32_MIN, .allow_empty = true});
  std::cout << tok->decode(ids);
}

void setup(CLI::App& app) {
  auto tokenize_opt = std::make_shared<TokenizeOptions>();
  CLI::App* tokenize = app.add_subcommand("tokenize", "Print the token ids of a text file as a JSON array");
  tokenize->add_option("--tokenizer", tokenize_opt->tokenizer, "tokenizer.json (default: the bundled gpt-oss one)");
  tokenize->add_option("--text-file", tokenize_opt->text_file, "file whose bytes are encoded")->required();
  tokenize->add_flag("--allow-special", tokenize_opt->allow_special,
                     "turn special-token spellings such as <|start|> into their ids (default: ordinary text)");
  tokenize->callback([tokenize_opt] { run_tokenize(*tokenize_opt); });

  auto detokenize_opt = std::make_shared<DetokenizeOptions>();
  CLI::App* detokenize = app.add_subcommand("detokenize", "Print the text of a JSON array of token ids");
  detokenize->add_option("--tokenizer", detokenize_opt->tokenizer, "tokenizer.json (default: the bundled gpt-oss one)");
  detokenize->add_option("--ids-file", detokenize_opt->ids_file, "file holding a JSON array of ids")->required();
  detokenize->callback([detokenize_opt] { run_detokenize(*detokenize_opt); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup);

}  // namespace ossrt::tools
