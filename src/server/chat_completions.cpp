#include "server/chat_completions.h"

#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/generation_job.h"
#include "server/openai_format.h"
#include "server/prompt_builder.h"
#include "server/request_fields.h"
#include "server/structured_request.h"

namespace ossrt::server {
namespace {

struct ChatOptions {
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;
  bool include_reasoning = true;  // include_reasoning:false / reasoning.exclude:true hide the CoT
  bool mirror_reasoning_content = false;
  bool want_logprobs = false;
};

class ChatJob : public GenerationJob {
 public:
  ChatJob(ServerContext& ctx, std::shared_ptr<Exchange> exchange, ChatOptions options, BuiltPrompt prompt, size_t n)
      : GenerationJob(ctx, std::move(exchange), ctx.next_id("chatcmpl-")),
        options_(options),
        prompt_(std::move(prompt)) {
    header_ = {id_, created_unix_, ctx.config.served_model_name};
    for (size_t i = 0; i < n; ++i) {
      choices_.push_back(std::make_unique<Choice>(ctx.tokenizer(), prompt_.declared_tools));
      // The forced tool-call header is part of the output's Harmony, not of what the model wrote.
      choices_.back()->mapper.push(prompt_.forced_prefix);
    }
  }

 private:
  struct Choice {
    Choice(std::shared_ptr<const Tokenizer> tok, std::set<std::string> tools)
        : mapper(std::move(tok), std::move(tools)) {}
    ChatOutputMapper mapper;
    bool role_sent = false;
    FinishReason finish = FinishReason::None;
    std::optional<int32_t> stop_token;
    nlohmann::json logprobs = nlohmann::json::array();
    int completion_tokens = 0;
  };

  void on_started() override {
    if (options_.stream && !client_gone()) exchange_->start_stream("text/event-stream");
  }

  void on_event(size_t index, const GenerationEvent& ev) override {
    Choice& c = *choices_[index];
    ChatDelta delta = c.mapper.push(ev.token_ids);
    if (ev.finished) {
      if (ev.stop_token) {
        int32_t stop = *ev.stop_token;
        delta.append(c.mapper.push(std::span<const int32_t>(&stop, 1)));
      }
      delta.append(c.mapper.finish());
      c.finish = ev.finish_reason;
      c.stop_token = ev.stop_token;
      c.completion_tokens = ev.completion_tokens;
      usage_.prompt_tokens = ev.prompt_tokens;
      usage_.cached_tokens = ev.cached_prompt_tokens;
      record_output_quality(c);
    }
    if (!options_.include_reasoning) delta.reasoning.clear();
    nlohmann::json logprobs = nullptr;
    if (options_.want_logprobs && !ev.logprobs.empty()) {
      auto entries = chat_logprob_entries(*ctx_.tokenizer(), ev.logprobs);
      if (options_.stream) logprobs = {{"content", entries}};
      for (auto& e : entries) c.logprobs.push_back(std::move(e));
    }
    if (options_.stream) stream_event(index, c, ev, delta, std::move(logprobs));
  }

  void record_output_quality(const Choice& c) {
    const MetricLabels model = {{"model_name", ctx_.config.served_model_name}};
    if (int n = c.mapper.recoveries().total()) {
      ctx_.metrics.add("ossrt:harmony_recoveries_total", model, n);
      spdlog::debug("[{}] Harmony parser recovered {} time(s)", exchange_->request_id(), n);
    }
    if (int n = c.mapper.dropped_tool_calls()) {
      ctx_.metrics.add("ossrt:dropped_tool_calls_total", model, n);
      spdlog::warn("[{}] dropped {} call(s) to undeclared function '{}'", exchange_->request_id(), n,
                   c.mapper.last_dropped_name());
    }
  }

  void stream_event(size_t index, Choice& c, const GenerationEvent& ev, const ChatDelta& delta,
                    nlohmann::json logprobs) {
    if (client_gone()) return;
    std::string out;
    const int i = int(index);
    bool has_output = !ev.token_ids.empty() || ev.finished;
    // The role chunk goes out with the first token (vllm bench's TTFT = first chunk with choices).
    if (!c.role_sent && has_output && ev.finish_reason != FinishReason::Abort &&
        ev.finish_reason != FinishReason::Error) {
      c.role_sent = true;
      out += chunk(chat_chunk(header_, i, chat_delta({}, false, true), std::nullopt));
    }
    // Reasoning, content and call fragments in their own chunks, in that order.
    auto emit = [&](ChatDelta part) {
      if (part.empty()) return;
      out += chunk(chat_chunk(header_, i, chat_delta(part, options_.mirror_reasoning_content, false), std::nullopt,
                              std::exchange(logprobs, nullptr)));
    };
    emit(ChatDelta{delta.reasoning, {}, {}});
    emit(ChatDelta{{}, delta.content, {}});
    emit(ChatDelta{{}, {}, delta.tool_calls});
    if (!logprobs.is_null())
      out += chunk(chat_chunk(header_, i, nlohmann::json::object(), std::nullopt, std::move(logprobs)));
    if (ev.finished) {
      if (ev.finish_reason == FinishReason::Error || ev.finish_reason == FinishReason::Abort) {
        // Mid-stream failure: an error event, never a silently truncated stream (docs/reference/SERVING.md 3).
        std::string message = ev.finish_reason == FinishReason::Error
                                  ? "generation failed: " + ev.error
                                  : "the request was aborted (the server is shutting down)";
        out += sse_data(
            {{"error",
              error_object(message, ev.finish_reason == FinishReason::Error ? "server_error" : "unavailable_error", "",
                           "")}});
        stream_failed_ = true;
      } else {
        nlohmann::json fin = chat_chunk(header_, i, nlohmann::json::object(),
                                        finish_reason_for(ev.finish_reason, !c.mapper.tool_calls().empty()));
        fin["choices"][0]["stop_reason"] = ev.stop_token ? nlohmann::json(*ev.stop_token) : nlohmann::json(nullptr);
        out += chunk(std::move(fin));
      }
    }
    if (!out.empty()) exchange_->stream_write(std::move(out));
  }

  std::string chunk(nlohmann::json payload) {
    if (options_.include_usage) {
      payload["usage"] = nullptr;
      if (options_.continuous_usage) payload["usage"] = chat_usage(current_usage());
    }
    return sse_data(payload);
  }

  UsageCounts current_usage() const {
    UsageCounts u = usage_;
    u.completion_tokens = 0;
    u.reasoning_tokens = 0;
    for (const auto& c : choices_) {
      u.completion_tokens += c->completion_tokens;
      u.reasoning_tokens += c->mapper.reasoning_tokens();
    }
    return u;
  }

  void on_all_finished() override {
    if (client_gone()) return;
    if (options_.stream) {
      std::string out;
      if (options_.include_usage && !stream_failed_) {
        nlohmann::json last = {
            {"id", header_.id},       {"object", "chat.completion.chunk"},  {"created", header_.created},
            {"model", header_.model}, {"choices", nlohmann::json::array()}, {"usage", chat_usage(current_usage())}};
        out += sse_data(last);
      }
      out += kSseDone;
      exchange_->stream_write(std::move(out));
      exchange_->end_stream();
      return;
    }
    nlohmann::json choices = nlohmann::json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = *choices_[i];
      if (c.finish == FinishReason::Error || c.finish == FinishReason::Abort) {
        ApiError e = c.finish == FinishReason::Error
                         ? internal_error("generation failed")
                         : unavailable("the request was aborted: the server is shutting down");
        exchange_->respond(e.status(), to_wire(e.to_json()), "application/json");
        return;
      }
      nlohmann::json choice = {
          {"index", i},
          {"message", chat_message(c.mapper.content(), c.mapper.reasoning(), c.mapper.tool_calls(),
                                   options_.mirror_reasoning_content, options_.include_reasoning)},
          {"logprobs", options_.want_logprobs ? nlohmann::json{{"content", c.logprobs}} : nlohmann::json(nullptr)},
          {"finish_reason", finish_reason_for(c.finish, !c.mapper.tool_calls().empty())},
          {"stop_reason", c.stop_token ? nlohmann::json(*c.stop_token) : nlohmann::json(nullptr)}};
      choices.push_back(std::move(choice));
    }
    nlohmann::json body = {{"id", header_.id},
                           {"object", "chat.completion"},
                           {"created", header_.created},
                           {"model", header_.model},
                           {"choices", std::move(choices)},
                           {"usage", chat_usage(current_usage())},
                           {"system_fingerprint", nullptr}};
    exchange_->respond(200, to_wire(body), "application/json");
  }

  ChatOptions options_;
  BuiltPrompt prompt_;
  ChunkHeader header_;
  std::vector<std::unique_ptr<Choice>> choices_;
  UsageCounts usage_;
  bool stream_failed_ = false;
};

ChatOptions read_chat_options(const ServerContext& ctx, const Json& body) {
  ChatOptions o;
  o.stream = bool_field(body, "stream").value_or(false);
  if (const Json* so = object_field(body, "stream_options")) {
    o.include_usage = bool_field(*so, "include_usage").value_or(false);
    o.continuous_usage = bool_field(*so, "continuous_usage_stats").value_or(false);
  }
  o.include_reasoning = bool_field(body, "include_reasoning").value_or(true);
  if (const Json* r = object_field(body, "reasoning"); r && bool_field(*r, "exclude").value_or(false))
    o.include_reasoning = false;
  o.mirror_reasoning_content = ctx.config.reasoning_content_mirror;
  o.want_logprobs = bool_field(body, "logprobs").value_or(false);
  return o;
}

}  // namespace

void handle_chat_completions(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body) {
  const GenerationLimits limits = ctx.generation_limits();
  ChatOptions options = read_chat_options(ctx, body);
  SamplingRequest sampling = parse_sampling(body, SamplingApi::Chat, limits, ctx.config.limits);
  read_metadata(body, ctx.config.limits);  // validated as OpenAI does; chat completions are not stored
  BuiltPrompt prompt = build_chat_prompt(ctx, body);
  resolve_max_tokens(sampling, int64_t(prompt.prompt_ids.size()), ctx.max_model_len());
  const StructuredPlan structured = plan_chat_constraint(ctx, body, prompt);

  std::vector<GenerationRequest> requests;
  for (int i = 0; i < sampling.n; ++i) {
    GenerationRequest r;
    r.prompt_ids = prompt.prompt_ids;
    r.sampling = sampling.params;
    if (r.sampling.seed && i > 0) *r.sampling.seed += uint64_t(i);  // n choices must differ
    r.constraint = structured.make(r.prompt_ids);                   // one per choice: it holds the choice's progress
    validate_for_generator(r, limits, sampling, "messages");
    requests.push_back(std::move(r));
  }
  auto job = std::make_shared<ChatJob>(ctx, exchange, options, std::move(prompt), requests.size());
  job->start(std::move(requests), options.stream);
}

}  // namespace ossrt::server
