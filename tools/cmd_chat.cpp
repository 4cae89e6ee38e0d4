// `ossrt chat`: an interactive terminal chat in Harmony. Each turn renders the conversation
// (system message with the reasoning effort, history with completed turns' analysis dropped),
// streams the reply through the Harmony parser, shows reasoning dimmed and the answer plain, and
// keeps the parsed reply in the history (a trailing <|return|> stored as <|end|>).
#include <spdlog/spdlog.h>

#include <unistd.h>
#include <cstdio>
#include <future>
#include <iostream>
#include <memory>
#include <string>

#include "command.h"
#include "core/error.h"
#include "harmony/chat_request.h"
#include "harmony/conversation.h"
#include "harmony/parser.h"
#include "harmony/renderer.h"
#include "runtime/model_runtime.h"
#include "runtime_flags.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::tools {
namespace {

struct ChatOptions {
  RuntimeOptions runtime;
  std::string reasoning_effort = "medium";
  std::string system;  // developer instructions
  int max_tokens = 2048;
  float temperature = 1.0f;
  float top_p = 1.0f;
  bool color = true;
};

// ANSI styling, only when stdout is a terminal (or forced), so piped transcripts stay clean.
struct Style {
  bool on;
  const char* dim() const { return on ? "\x1b[2m" : ""; }
  const char* reset() const { return on ? "\x1b[0m" : ""; }
};

// Prints parser events: analysis dimmed, final plain, tool calls and other channels labelled.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(Style style) : style_(style) {}
  void print(const std::vector<harmony::ParserEvent>& events) {
    for (const auto& ev : events) {
      if (const auto* start = std::get_if<harmony::MessageStart>(&ev)) {
        dimmed_ = start->channel == "analysis";
        std::fputs(dimmed_ ? style_.dim() : style_.reset(), stdout);
        if (!start->recipient.empty()) std::printf("[%s -> %s] ", start->channel.c_str(), start->recipient.c_str());
      } else if (const auto* delta = std::get_if<harmony::ContentDelta>(&ev)) {
        std::fputs(delta->text.c_str(), stdout);
      } else {
        std::fputs(style_.reset(), stdout);
        std::fputs("\n", stdout);
        dimmed_ = false;
      }
    }
    std::fflush(stdout);
  }

 private:
  Style style_;
  bool dimmed_ = false;
};

void run_chat(const ChatOptions& o) {
  const auto effort = harmony::parse_reasoning_effort(o.reasoning_effort);
  OSSRT_CHECK(effort.has_value(), "--reasoning-effort must be low, medium or high, got '{}'", o.reasoning_effort);
  auto runtime = ModelRuntime::build(o.runtime);
  std::shared_ptr<const Tokenizer> tokenizer = runtime->tokenizer();
  OSSRT_CHECK(tokenizer != nullptr, "chat needs a tokenizer: pass --tokenizer PATH");
  spdlog::info("chat with {} on {} (reasoning effort {}); /reset clears the history, /exit or Ctrl-D quits",
               runtime->config().name, runtime->describe(), o.reasoning_effort);

  harmony::Conversation conversation;
  conversation.system.effort = *effort;
  conversation.system.current_date = harmony::today_utc_date();
  conversation.developer_instructions = o.system;
  const Style style{o.color && isatty(fileno(stdout))};
  int turn = 0;

  std::string line;
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      conversation.messages.clear();
      continue;
    }
    conversation.messages.push_back(harmony::user_message(line));
    const harmony::RenderedPrompt prompt = harmony::render_for_completion(conversation, *tokenizer);

    GenerationRequest request;
    request.id = "chat-" + std::to_string(turn++);
    request.prompt_ids = prompt.token_ids;
    request.sampling.temperature = o.temperature;
    request.sampling.top_p = o.top_p;
    request.sampling.seed = o.runtime.seed;
    request.sampling.max_tokens = o.max_tokens;

    harmony::StreamParser parser(tokenizer, harmony::Role::Assistant);
    ReplyPrinter printer(style);
    std::promise<GenerationEvent> finished;
    // Runs on the engine thread; the main thread only waits for `finished`.
    const bool accepted = runtime->engine().submit(std::move(request), [&](const GenerationEvent& ev) {
      for (int32_t id : ev.token_ids) printer.print(parser.push(id));
      if (ev.finished) {
        // The stop token (<|return|>, <|call|>) is not streamed; the parser needs it to close the message.
        if (ev.stop_token) printer.print(parser.push(*ev.stop_token));
        printer.print(parser.finish());
        finished.set_value(ev);
      }
    });
    OSSRT_CHECK(accepted, "the engine refused the request");
    const GenerationEvent last = finished.get_future().get();
    std::fputs(style.reset(), stdout);
    if (last.finish_reason == FinishReason::Error) {
      std::fprintf(stderr, "error: %s\n", last.error.c_str());
      conversation.messages.pop_back();
      continue;
    }
    if (last.finish_reason == FinishReason::Length) std::fputs("[stopped at --max-tokens]\n", stdout);
    for (const auto& m : parser.messages()) conversation.messages.push_back(m.to_message());
  }
}

void setup_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  // One conversation: a batch of one, 512-token prefill steps.
  o->runtime.max_num_seqs = 1;
  o->runtime.max_num_batched_tokens = 512;
  o->runtime.max_queue = 1;
  CLI::App* cmd = app.add_subcommand("chat", "Interactive Harmony chat in the terminal");
  add_runtime_flags(cmd, o->runtime, RuntimeFlagGroups::ModelAndEngine);
  cmd->add_option("--reasoning-effort", o->reasoning_effort, "low | medium | high")
      ->check(CLI::IsMember({"low", "medium", "high"}));
  cmd->add_option("--system", o->system, "Developer instructions for the whole chat");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens per reply at most (reasoning included)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--temperature", o->temperature)->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->top_p);
  cmd->add_flag("!--no-color", o->color, "No ANSI styling (reasoning is then not dimmed)");
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace

OSSRT_REGISTER_COMMAND(setup_chat);

}  // namespace ossrt::tools
