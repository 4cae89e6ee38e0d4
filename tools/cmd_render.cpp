// `ossrt render`: the Harmony prompt the server would build for an OpenAI chat-completions
// request, as text (special tokens spelled out) or as token ids. Same code path as the server.
#include <fstream>
#include <iostream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "harmony/chat_request.h"
#include "harmony/renderer.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {
namespace {

struct RenderCommandOptions {
  std::string request_file;
  std::string tokenizer;
  std::string current_date;  // empty -> today (UTC); "none" -> no Current date line
  bool print_ids = false;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void run_render(const RenderCommandOptions& opt) {
  harmony::ChatRequestOptions request_options;
  if (opt.current_date.empty()) {
    request_options.current_date = harmony::today_utc_date();
  } else if (opt.current_date != "none") {
    if (!harmony::is_valid_date(opt.current_date)) {
      fail("--current-date: expected YYYY-MM-DD or none, got '{}'", opt.current_date);
    }
    request_options.current_date = opt.current_date;
  }
  // ordered_json: tool schema properties are rendered in the order the request lists them.
  const auto body = nlohmann::ordered_json::parse(read_text_file(opt.request_file), nullptr, false);
  if (body.is_discarded()) fail("{}: not valid JSON", opt.request_file);
  harmony::ChatConversation request;
  try {
    request = harmony::conversation_from_chat_request(body, request_options);
  } catch (const harmony::HarmonyRequestError& e) {
    fail("{}: invalid request: {}", opt.request_file, e.what());
  }
  const auto tok = Tokenizer::load(opt.tokenizer.empty() ? default_tokenizer_path() : opt.tokenizer);
  const harmony::RenderedPrompt prompt = harmony::render_for_completion(request.conversation, *tok);
  if (opt.print_ids) {
    std::cout << nlohmann::json(prompt.token_ids).dump() << "\n";
  } else {
    std::cout << prompt.text << "\n";
  }
}

void setup_render(CLI::App& app) {
  auto opt = std::make_shared<RenderCommandOptions>();
  CLI::App* cmd = app.add_subcommand("render", "Print the Harmony prompt for an OpenAI chat-completions request body");
  cmd->add_option("--request", opt->request_file, "chat-completions request JSON file")->required();
  cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json (default: the bundled gpt-oss one)");
  cmd->add_option("--current-date", opt->current_date,
                  "YYYY-MM-DD for the system message, or 'none' (default: today, UTC)");
  cmd->add_flag("--ids", opt->print_ids, "print token ids (JSON array) instead of text");
  cmd->callback([opt] { run_render(*opt); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_render);

}  // namespace ossrt::tools
