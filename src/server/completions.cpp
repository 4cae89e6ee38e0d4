#include "server/completions.h"

#include "server/api_error.h"
#include "server/generation_job.h"
#include "server/openai_format.h"
#include "server/prompt_builder.h"
#include "server/request_fields.h"
#include "server/structured_request.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {
namespace {

struct CompletionOptions {
  bool stream = false;
  bool include_usage = false;
  bool echo = false;
  bool skip_special_tokens = true;
  bool want_logprobs = false;
};

// Completions-style logprobs: parallel arrays (the chat shape differs, vllm#3179).
struct CompletionLogprobs {
  nlohmann::json tokens = nlohmann::json::array(), token_logprobs = nlohmann::json::array(),
                 top_logprobs = nlohmann::json::array(), text_offset = nlohmann::json::array();
  nlohmann::json to_json() const {
    return {{"tokens", tokens},
            {"token_logprobs", token_logprobs},
            {"top_logprobs", top_logprobs},
            {"text_offset", text_offset}};
  }
};

class CompletionJob : public GenerationJob {
 public:
  CompletionJob(ServerContext& ctx, std::shared_ptr<Exchange> exchange, CompletionOptions options,
                std::vector<std::string> echo_texts)
      : GenerationJob(ctx, std::move(exchange), ctx.next_id("cmpl-")), options_(options) {
    for (auto& echo : echo_texts) {
      auto c = std::make_unique<Choice>(ctx.tokenizer());
      if (options_.echo) c->text = std::move(echo);
      choices_.push_back(std::move(c));
    }
  }

 private:
  struct Choice {
    explicit Choice(std::shared_ptr<const Tokenizer> tok) : decoder(std::move(tok)) {}
    IncrementalDecoder decoder;
    std::string text;
    FinishReason finish = FinishReason::None;
    std::optional<int32_t> stop_token;
    CompletionLogprobs logprobs;
    int completion_tokens = 0;
    bool echo_sent = false;
  };

  void on_started() override {
    if (options_.stream && !client_gone()) exchange_->start_stream("text/event-stream");
  }

  std::string decode(Choice& c, const std::vector<int32_t>& ids, CompletionLogprobs* lp_out,
                     const std::vector<TokenLogprob>& lps) {
    const Tokenizer& tok = *ctx_.tokenizer();
    std::string text;
    for (size_t k = 0; k < ids.size(); ++k) {
      int32_t id = ids[k];
      if (options_.skip_special_tokens && tok.is_special(id)) continue;
      std::string piece = c.decoder.push(id);
      if (lp_out && k < lps.size()) {
        lp_out->tokens.push_back(tok.token_bytes(id));
        lp_out->token_logprobs.push_back(lps[k].logprob);
        nlohmann::json top = nlohmann::json::object();
        for (const auto& [alt, value] : lps[k].top) top[tok.token_bytes(alt)] = value;
        lp_out->top_logprobs.push_back(lps[k].top.empty() ? nlohmann::json(nullptr) : top);
        lp_out->text_offset.push_back(c.text.size() + text.size());
      }
      text += piece;
    }
    return text;
  }

  void on_event(size_t index, const GenerationEvent& ev) override {
    Choice& c = *choices_[index];
    CompletionLogprobs delta_lp;
    bool lp = options_.want_logprobs && !ev.logprobs.empty();
    std::string text = decode(c, ev.token_ids, lp ? &delta_lp : nullptr, ev.logprobs);
    if (ev.finished) {
      text += c.decoder.flush();
      c.finish = ev.finish_reason;
      c.stop_token = ev.stop_token;
      c.completion_tokens = ev.completion_tokens;
      usage_.prompt_tokens = ev.prompt_tokens;
      usage_.cached_tokens = ev.cached_prompt_tokens;
    }
    if (lp) {
      for (size_t k = 0; k < delta_lp.tokens.size(); ++k) {
        c.logprobs.tokens.push_back(delta_lp.tokens[k]);
        c.logprobs.token_logprobs.push_back(delta_lp.token_logprobs[k]);
        c.logprobs.top_logprobs.push_back(delta_lp.top_logprobs[k]);
        c.logprobs.text_offset.push_back(delta_lp.text_offset[k]);
      }
    }
    if (!options_.stream) {
      c.text += text;
      return;
    }
    if (client_gone()) return;
    if (options_.echo && !c.echo_sent) {
      text = c.text + text;
      c.echo_sent = true;
    }
    std::string out;
    if (!text.empty() || lp) out += chunk(index, text, std::nullopt, lp ? delta_lp.to_json() : nlohmann::json(nullptr));
    if (ev.finished) {
      if (ev.finish_reason == FinishReason::Error || ev.finish_reason == FinishReason::Abort) {
        out +=
            sse_data({{"error", error_object(ev.finish_reason == FinishReason::Error ? "generation failed: " + ev.error
                                                                                     : "the request was aborted",
                                             "server_error", "", "")}});
        failed_ = true;
      } else {
        out += chunk(index, "", finish_reason_for(ev.finish_reason, false), nullptr);
      }
    }
    if (!out.empty()) exchange_->stream_write(std::move(out));
  }

  std::string chunk(size_t index, const std::string& text, const std::optional<std::string>& finish,
                    nlohmann::json logprobs) {
    nlohmann::json choice = {{"index", index},
                             {"text", text},
                             {"logprobs", std::move(logprobs)},
                             {"finish_reason", finish ? nlohmann::json(*finish) : nlohmann::json(nullptr)}};
    nlohmann::json payload = {{"id", id_},
                              {"object", "text_completion"},
                              {"created", created_unix_},
                              {"model", ctx_.config.served_model_name},
                              {"choices", nlohmann::json::array({choice})}};
    if (options_.include_usage) payload["usage"] = nullptr;
    return sse_data(payload);
  }

  UsageCounts total_usage() const {
    UsageCounts u = usage_;
    u.completion_tokens = 0;
    for (const auto& c : choices_) u.completion_tokens += c->completion_tokens;
    return u;
  }

  void on_all_finished() override {
    if (client_gone()) return;
    nlohmann::json usage = chat_usage(total_usage());
    usage.erase("completion_tokens_details");  // no reasoning in raw completions
    if (options_.stream) {
      std::string out;
      if (options_.include_usage && !failed_) {
        out += sse_data({{"id", id_},
                         {"object", "text_completion"},
                         {"created", created_unix_},
                         {"model", ctx_.config.served_model_name},
                         {"choices", nlohmann::json::array()},
                         {"usage", usage}});
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
      choices.push_back({{"index", i},
                         {"text", c.text},
                         {"logprobs", options_.want_logprobs ? c.logprobs.to_json() : nlohmann::json(nullptr)},
                         {"finish_reason", finish_reason_for(c.finish, false)},
                         {"stop_reason", c.stop_token ? nlohmann::json(*c.stop_token) : nlohmann::json(nullptr)}});
    }
    nlohmann::json body = {{"id", id_},
                           {"object", "text_completion"},
                           {"created", created_unix_},
                           {"model", ctx_.config.served_model_name},
                           {"choices", std::move(choices)},
                           {"usage", usage}};
    exchange_->respond(200, to_wire(body), "application/json");
  }

  CompletionOptions options_;
  std::vector<std::unique_ptr<Choice>> choices_;
  UsageCounts usage_;
  bool failed_ = false;
};

// `prompt`: a string, an array of token ids, or a one-element array of either (vLLM accepts
// batches; ossrt answers one prompt per request and says so). A prompt longer than the context
// is refused as soon as that is certain, without tokenizing the rest.
std::vector<int32_t> read_prompt(const ServerContext& ctx, const Json& body) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_request("prompt: required", "prompt");
  const Json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    prompt = &(*prompt)[0];
  const int max_model_len = std::max(1, ctx.max_model_len());
  if (prompt->is_string()) {
    auto ids =
        ctx.tokenizer()->encode_with_special_at_most(prompt->get_ref<const std::string&>(), size_t(max_model_len));
    if (!ids) throw prompt_too_long(size_t(max_model_len), "prompt");
    if (ids->empty()) throw bad_request("prompt: must not be empty", "prompt");
    return std::move(*ids);
  }
  if (prompt->is_array() && !prompt->empty()) {
    if (prompt->size() > size_t(max_model_len)) throw prompt_too_long(size_t(max_model_len), "prompt");
    std::vector<int32_t> ids;
    ids.reserve(prompt->size());
    const int vocab = ctx.tokenizer()->vocab_size();
    for (size_t i = 0; i < prompt->size(); ++i) {
      const Json& v = (*prompt)[i];
      if (!v.is_number_integer())
        throw bad_request(fmt::format("prompt[{}]: expected a token id (a list of strings is a batch, "
                                      "which this server does not accept; send one request per prompt)",
                                      i),
                          "prompt");
      bool in_range = !(v.is_number_unsigned() && v.get<uint64_t>() >= uint64_t(vocab)) && v.get<int64_t>() >= 0 &&
                      v.get<int64_t>() < vocab;
      if (!in_range)
        throw bad_request(fmt::format("prompt[{}]: token id {} is out of range [0, {})", i, v.dump(), vocab), "prompt");
      ids.push_back(int32_t(v.get<int64_t>()));
    }
    return ids;
  }
  throw bad_request("prompt: expected a non-empty string or array of token ids", "prompt");
}

}  // namespace

void handle_completions(ServerContext& ctx, const std::shared_ptr<Exchange>& exchange, const Json& body) {
  const GenerationLimits limits = ctx.generation_limits();
  CompletionOptions options;
  options.stream = bool_field(body, "stream").value_or(false);
  if (const Json* so = object_field(body, "stream_options"))
    options.include_usage = bool_field(*so, "include_usage").value_or(false);
  options.echo = bool_field(body, "echo").value_or(false);
  options.skip_special_tokens = bool_field(body, "skip_special_tokens").value_or(true);
  SamplingRequest sampling = parse_sampling(body, SamplingApi::Completions, limits, ctx.config.limits);
  options.want_logprobs = sampling.params.logprobs >= 0;
  if (auto v = string_field(body, "suffix"); v && !v->empty()) throw bad_request("suffix: not supported", "suffix");
  std::vector<int32_t> prompt = read_prompt(ctx, body);
  resolve_max_tokens(sampling, int64_t(prompt.size()), ctx.max_model_len(), "prompt");
  const StructuredPlan structured = plan_completion_constraint(ctx, body);

  std::vector<GenerationRequest> requests;
  std::vector<std::string> echoes;
  for (int i = 0; i < sampling.n; ++i) {
    GenerationRequest r;
    r.prompt_ids = prompt;
    r.sampling = sampling.params;
    if (r.sampling.seed && i > 0) *r.sampling.seed += uint64_t(i);
    r.constraint = structured.make(r.prompt_ids);
    validate_for_generator(r, limits, sampling, "prompt");
    requests.push_back(std::move(r));
    echoes.push_back(options.echo ? ctx.tokenizer()->decode(prompt) : std::string());
  }
  auto job = std::make_shared<CompletionJob>(ctx, exchange, options, std::move(echoes));
  job->start(std::move(requests), options.stream);
}

}  // namespace ossrt::server
