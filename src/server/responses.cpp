#include "server/responses.h"

#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/generation_job.h"
#include "server/openai_format.h"
#include "server/prompt_builder.h"
#include "server/request_fields.h"
#include "server/response_store.h"
#include "server/responses_output.h"
#include "server/structured_request.h"

namespace ossrt::server {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::string text_of_content(const ordered_json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw bad_request(param + ": expected a string or an array of content parts", param);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& part = content[i];
    std::string where = fmt::format("{}[{}]", param, i);
    if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) {
      std::string type = part.is_object() ? string_field(part, "type", where + ".type").value_or("") : "";
      throw bad_request(fmt::format("{}: unsupported content part{} (only text parts are supported)", where,
                                    type.empty() ? "" : " of type " + type),
                        where);
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// Input items -> chat messages. Reasoning items attach to the next assistant message.
ordered_json input_to_messages(const ordered_json& input) {
  ordered_json messages = ordered_json::array();
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array()) throw bad_request("input: expected a string or an array of input items", "input");
  std::string pending_reasoning;
  auto attach_reasoning = [&](ordered_json& m) {
    if (!pending_reasoning.empty()) m["reasoning"] = std::exchange(pending_reasoning, {});
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const auto& item = input[i];
    std::string where = fmt::format("input[{}]", i);
    if (!item.is_object()) throw bad_request(where + ": expected an object", where);
    std::string type = string_field(item, "type", where + ".type").value_or(item.contains("role") ? "message" : "");
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string())
        throw bad_request(where + ".role: expected a string", where + ".role");
      std::string role = item["role"].get<std::string>();
      const auto content = item.find("content");
      ordered_json m = {
          {"role", role},
          {"content", text_of_content(content == item.end() ? ordered_json("") : *content, where + ".content")}};
      if (role == "assistant") attach_reasoning(m);
      messages.push_back(std::move(m));
    } else if (type == "function_call") {
      for (const char* key : {"call_id", "name", "arguments"})
        if (!item.contains(key) || !item[key].is_string())
          throw bad_request(fmt::format("{}.{}: expected a string", where, key), where + "." + key);
      ordered_json call = {{"id", item["call_id"]},
                           {"type", "function"},
                           {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Consecutive calls of one turn form one assistant message with several tool_calls.
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls") &&
          pending_reasoning.empty()) {
        messages.back()["tool_calls"].push_back(std::move(call));
      } else {
        ordered_json m = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ordered_json::array({call})}};
        attach_reasoning(m);
        messages.push_back(std::move(m));
      }
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string())
        throw bad_request(where + ".call_id: expected a string", where + ".call_id");
      const auto& output = item.contains("output") ? item["output"] : ordered_json("");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item["call_id"]},
                          {"content", output.is_string() ? output.get<std::string>() : output.dump()}});
    } else if (type == "reasoning") {
      if (item.contains("content") && item["content"].is_array())
        for (const auto& part : item["content"])
          if (part.is_object() && part.contains("text") && part["text"].is_string())
            pending_reasoning += part["text"].get<std::string>();
    } else {
      throw bad_request(fmt::format("{}.type: unsupported input item type '{}'", where, echo(type)), where + ".type");
    }
  }
  if (!pending_reasoning.empty())
    messages.push_back({{"role", "assistant"}, {"content", ""}, {"reasoning", pending_reasoning}});
  return messages;
}

ordered_json convert_tools(const ordered_json& tools) {
  ordered_json out = ordered_json::array();
  if (!tools.is_array()) throw bad_request("tools: expected an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& t = tools[i];
    std::string where = fmt::format("tools[{}]", i);
    if (!t.is_object() || string_field(t, "type", where + ".type").value_or("") != "function")
      throw bad_request(where + ".type: only function tools are supported (built-in tools are off)", where + ".type");
    if (!t.contains("name") || !t["name"].is_string())
      throw bad_request(where + ".name: expected a string", where + ".name");
    ordered_json fn = {{"name", t["name"]}};
    if (t.contains("description")) fn["description"] = t["description"];
    if (t.contains("parameters")) fn["parameters"] = t["parameters"];
    if (t.contains("strict")) fn["strict"] = t["strict"];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

}  // namespace

ordered_json responses_to_chat_body(const ordered_json& request, const ordered_json& history,
                                    ordered_json* input_messages) {
  ordered_json chat = ordered_json::object();
  ordered_json messages = ordered_json::array();
  if (request.contains("instructions") && !request["instructions"].is_null()) {
    if (!request["instructions"].is_string()) throw bad_request("instructions: expected a string", "instructions");
    messages.push_back({{"role", "developer"}, {"content", request["instructions"]}});
  }
  for (const auto& m : history) messages.push_back(m);
  if (!request.contains("input")) throw bad_request("input: required", "input");
  ordered_json new_messages = input_to_messages(request["input"]);
  for (const auto& m : new_messages) messages.push_back(m);
  if (input_messages) *input_messages = new_messages;
  chat["messages"] = std::move(messages);
  if (request.contains("tools") && !request["tools"].is_null()) chat["tools"] = convert_tools(request["tools"]);
  if (request.contains("tool_choice") && !request["tool_choice"].is_null()) {
    const auto& tc = request["tool_choice"];
    if (tc.is_object() && string_field(tc, "type", "tool_choice.type").value_or("") == "function" &&
        tc.contains("name"))
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    else
      chat["tool_choice"] = tc;
  }
  if (request.contains("reasoning") && request["reasoning"].is_object() && request["reasoning"].contains("effort") &&
      !request["reasoning"]["effort"].is_null())
    chat["reasoning_effort"] = request["reasoning"]["effort"];
  if (request.contains("text") && request["text"].is_object() && request["text"].contains("format")) {
    const auto& f = request["text"]["format"];
    const std::string type = f.is_object() ? string_field(f, "type", "text.format.type").value_or("") : "";
    if (type == "json_schema") {
      ordered_json schema = {{"name", string_field(f, "name", "text.format.name").value_or("response")}};
      if (f.contains("schema")) schema["schema"] = f["schema"];
      if (f.contains("description")) schema["description"] = f["description"];
      chat["response_format"] = {{"type", "json_schema"}, {"json_schema", schema}};
    } else if (type == "json_object") {
      chat["response_format"] = {{"type", "json_object"}};
    }
  }
  return chat;
}

namespace {

class ResponseJob : public GenerationJob {
 public:
  ResponseJob(ServerContext& ctx, std::shared_ptr<Exchange> exchange, bool stream, bool store, std::string owner,
              json base, BuiltPrompt prompt, ordered_json conversation)
      : GenerationJob(ctx, std::move(exchange), ctx.next_id("resp_")),
        stream_(stream),
        store_(store),
        owner_(std::move(owner)),
        base_(std::move(base)),
        prompt_(std::move(prompt)),
        conversation_(std::move(conversation)),
        output_(ctx.tokenizer(), prompt_.declared_tools) {
    std::vector<json> ignored;
    output_.push(prompt_.forced_prefix, ignored);
    base_["id"] = id_;
    base_["created_at"] = created_unix_;
  }

 private:
  json response_object(const std::string& status) const {
    json r = base_;
    r["status"] = status;
    r["output"] = output_.items();
    r["usage"] = status == "in_progress" ? json(nullptr) : responses_usage(usage_);
    return r;
  }

  void write_events(std::vector<json>& events) {
    if (!stream_ || client_gone() || events.empty()) return;
    std::string out;
    for (auto& e : events) {
      e["sequence_number"] = sequence_++;
      out += sse_event(e["type"].get<std::string>(), e);
    }
    events.clear();
    exchange_->stream_write(std::move(out));
  }

  void on_started() override {
    if (!stream_ || client_gone()) return;
    exchange_->start_stream("text/event-stream");
    std::vector<json> events = {{{"type", "response.created"}, {"response", response_object("in_progress")}},
                                {{"type", "response.in_progress"}, {"response", response_object("in_progress")}}};
    write_events(events);
  }

  void on_event(size_t, const GenerationEvent& ev) override {
    std::vector<json> events;
    output_.push(ev.token_ids, events);
    if (ev.finished) {
      if (ev.stop_token) {
        int32_t stop = *ev.stop_token;
        output_.push(std::span<const int32_t>(&stop, 1), events);
      }
      output_.finish(events);
      finish_ = ev.finish_reason;
      usage_.prompt_tokens = ev.prompt_tokens;
      usage_.cached_tokens = ev.cached_prompt_tokens;
      usage_.completion_tokens = ev.completion_tokens;
      usage_.reasoning_tokens = output_.reasoning_tokens();
      const MetricLabels model = {{"model_name", ctx_.config.served_model_name}};
      if (int n = output_.recoveries().total()) ctx_.metrics.add("ossrt:harmony_recoveries_total", model, n);
      if (int n = output_.dropped_tool_calls()) ctx_.metrics.add("ossrt:dropped_tool_calls_total", model, n);
    }
    write_events(events);
  }

  void on_all_finished() override {
    std::string status = "completed";
    json final_object;
    if (finish_ == FinishReason::Length) {
      status = "incomplete";
      final_object = response_object(status);
      final_object["incomplete_details"] = {{"reason", "max_output_tokens"}};
    } else if (finish_ == FinishReason::Error || finish_ == FinishReason::Abort) {
      status = finish_ == FinishReason::Abort ? "cancelled" : "failed";
      final_object = response_object(status);
      final_object["error"] = {
          {"code", "server_error"},
          {"message", finish_ == FinishReason::Abort ? "the request was aborted" : "generation failed"}};
    } else {
      final_object = response_object(status);
    }
    if (store_ && finish_ != FinishReason::Abort) {
      ordered_json messages = conversation_;
      for (const auto& m : output_.as_chat_messages()) messages.push_back(m);
      if (!ctx_.responses->put(id_, owner_, StoredResponse{final_object, std::move(messages)}))
        spdlog::warn("[{}] response {} not stored: larger than the whole store", exchange_->request_id(), id_);
    }
    if (client_gone()) return;
    if (stream_) {
      std::string type = status == "completed"    ? "response.completed"
                         : status == "incomplete" ? "response.incomplete"
                                                  : "response.failed";
      std::vector<json> events = {{{"type", type}, {"response", final_object}}};
      write_events(events);
      exchange_->end_stream();
      return;
    }
    if (finish_ == FinishReason::Abort || finish_ == FinishReason::Error) {
      ApiError e = finish_ == FinishReason::Error ? internal_error("generation failed")
                                                  : unavailable("the request was aborted: the server is shutting down");
      exchange_->respond(e.status(), to_wire(e.to_json()), "application/json");
      return;
    }
    exchange_->respond(200, to_wire(final_object), "application/json");
  }

  bool stream_, store_;
  std::string owner_;  // the principal that may read and continue it (server/auth.h)
  json base_;
  BuiltPrompt prompt_;
  ordered_json conversation_;  // the messages the prompt was built from (minus instructions)
  ResponsesOutput output_;
  UsageCounts usage_;
  FinishReason finish_ = FinishReason::None;
  int64_t sequence_ = 0;
};

}  // namespace

void handle_create_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body,
                            const std::string& principal) {
  const GenerationLimits limits = ctx.generation_limits();
  bool stream = bool_field(body, "stream").value_or(false);
  bool store = bool_field(body, "store").value_or(true);
  if (bool_field(body, "background").value_or(false))
    throw bad_request("background: background responses are not supported by this server", "background");
  SamplingRequest sampling = parse_sampling(body, SamplingApi::Responses, limits, ctx.config.limits);
  json metadata = read_metadata(body, ctx.config.limits);
  bool parallel_tool_calls = bool_field(body, "parallel_tool_calls").value_or(true);
  std::string truncation = string_field(body, "truncation").value_or("disabled");
  if (truncation != "disabled" && truncation != "auto")
    throw bad_request(fmt::format("truncation: expected 'auto' or 'disabled', got '{}'", echo(truncation)),
                      "truncation");

  ordered_json history = ordered_json::array();
  json previous_id = nullptr;
  if (auto prev = string_field(body, "previous_response_id")) {
    auto stored = ctx.responses->get(*prev, principal);
    if (!stored)
      throw not_found(fmt::format("Previous response with id '{}' not found.", echo(*prev)), "previous_response_id");
    history = stored->messages;
    previous_id = *prev;
  }
  ordered_json input_messages;
  ordered_json chat_body = responses_to_chat_body(body, history, &input_messages);
  BuiltPrompt prompt = build_chat_prompt(ctx, chat_body, "input");
  resolve_max_tokens(sampling, int64_t(prompt.prompt_ids.size()), ctx.max_model_len(), "input");
  if (auto budget = body.find("thinking_token_budget"); budget != body.end())
    chat_body["thinking_token_budget"] = *budget;
  const StructuredPlan structured = plan_chat_constraint(ctx, chat_body, prompt, StructuredApi::Responses);

  // The conversation to store: history + this input (instructions are per request, not stored).
  ordered_json conversation = history;
  for (const auto& m : input_messages) conversation.push_back(m);

  auto echo_field = [&](const char* key, json fallback) {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? fallback : json(*it);
  };
  json base = {{"object", "response"},
               {"model", ctx.config.served_model_name},
               {"instructions", echo_field("instructions", nullptr)},
               {"previous_response_id", previous_id},
               {"tools", body.contains("tools") && body["tools"].is_array() ? json(body["tools"]) : json::array()},
               {"tool_choice", echo_field("tool_choice", "auto")},
               {"parallel_tool_calls", parallel_tool_calls},
               {"reasoning", {{"effort", harmony::effort_name(prompt.effort)}, {"summary", nullptr}}},
               {"temperature", sampling.params.temperature},
               {"top_p", sampling.params.top_p},
               {"max_output_tokens", sampling.max_tokens ? json(*sampling.max_tokens) : json(nullptr)},
               {"store", store},
               {"truncation", truncation},
               {"text", {{"format", {{"type", "text"}}}}},
               {"metadata", std::move(metadata)},
               {"error", nullptr},
               {"incomplete_details", nullptr}};

  GenerationRequest r;
  r.prompt_ids = prompt.prompt_ids;
  r.sampling = sampling.params;
  r.constraint = structured.make(r.prompt_ids);
  validate_for_generator(r, limits, sampling, "input");
  std::vector<GenerationRequest> requests;
  requests.push_back(std::move(r));
  auto job = std::make_shared<ResponseJob>(ctx, exchange, stream, store, principal, std::move(base), std::move(prompt),
                                           std::move(conversation));
  job->start(std::move(requests), stream);
}

void handle_get_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id,
                         const std::string& principal) {
  auto stored = ctx.responses->get(id, principal);
  if (!stored) throw not_found(fmt::format("Response with id '{}' not found.", id), "response_id");
  exchange->respond(200, to_wire(stored->response), "application/json");
}

void handle_cancel_response(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const std::string& id,
                            const std::string& principal) {
  auto stored = ctx.responses->get(id, principal);
  if (!stored) throw not_found(fmt::format("Response with id '{}' not found.", id), "response_id");
  // Only background responses can be cancelled (OpenAI); this server runs none, so a stored
  // response is always finished already.
  throw bad_request("Only background responses can be cancelled; this response has already finished.", "response_id");
}

}  // namespace ossrt::server
