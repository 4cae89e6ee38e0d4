#include "bench/request_record.h"

#include <fmt/format.h>

#include "bench/clock.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::bench {

namespace {
constexpr size_t kStreamHeadBytes = 2048;

int64_t int_or(const nlohmann::json& obj, const char* key, int64_t fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}
}  // namespace

StreamRecorder::StreamRecorder(RequestRecord& record, Clock::time_point sent, bool chat)
    : record_(record), sent_(sent), now_(sent), last_choice_(sent), chat_(chat), parser_([this](const SseEvent& e) {
        on_event(e);
      }) {}

void StreamRecorder::on_bytes(std::string_view bytes, Clock::time_point arrived) {
  now_ = arrived;
  if (head_.size() < kStreamHeadBytes) head_.append(bytes.substr(0, kStreamHeadBytes - head_.size()));
  parser_.feed(bytes);
}

void StreamRecorder::on_event(const SseEvent& event) {
  if (event.data == "[DONE]") return;
  record_.e2el_s = seconds(now_ - sent_);
  nlohmann::json chunk = nlohmann::json::parse(event.data, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded()) {
    if (stream_error_.empty())
      stream_error_ = "the stream carried an event that is not JSON: " + event.data.substr(0, 500);
    return;
  }
  if (!chunk.is_object()) return;
  if (auto err = chunk.find("error"); err != chunk.end() && !err->is_null()) {
    if (stream_error_.empty())
      stream_error_ =
          "error event in the stream: " + chunk.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array() && !choices->empty()) {
    if (!first_) {
      first_ = true;
      record_.ttft_s = seconds(now_ - sent_);
    } else {
      record_.itl_s.push_back(seconds(now_ - last_choice_));
    }
    last_choice_ = now_;
    ++record_.chunks;
    const auto& c = (*choices)[0];
    if (c.is_object()) {
      if (chat_) {
        if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
          for (const char* key : {"reasoning", "reasoning_content", "content"}) {
            auto t = d->find(key);
            if (t != d->end() && t->is_string()) record_.generated_text += t->get<std::string>();
          }
        }
      } else if (auto t = c.find("text"); t != c.end() && t->is_string()) {
        record_.generated_text += t->get<std::string>();
      }
      if (auto f = c.find("finish_reason"); f != c.end() && f->is_string())
        record_.finish_reason = f->get<std::string>();
    }
  }
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    usage_seen_ = true;
    record_.output_tokens = int_or(*usage, "completion_tokens", 0);
    record_.server_prompt_tokens = int_or(*usage, "prompt_tokens", -1);
    if (auto details = usage->find("prompt_tokens_details"); details != usage->end() && details->is_object())
      record_.cached_prompt_tokens = int_or(*details, "cached_tokens", -1);
  }
}

void StreamRecorder::finish(const HttpResult& result, const Tokenizer* tokenizer) {
  record_.http_status = result.status;
  if (!result.error.empty()) {
    record_.error = result.status ? fmt::format("HTTP {} then {}", result.status, result.error) : result.error;
  } else if (result.status != 200) {
    record_.error = fmt::format("HTTP {}: {}", result.status, result.body);
  } else if (!stream_error_.empty()) {
    record_.error = stream_error_;
  } else if (!first_) {
    record_.error = "never received a data event with choices (no first token); the answer began: " + head_;
  }
  record_.success = record_.error.empty();
  if (!record_.success) return;
  if (usage_seen_ && record_.output_tokens > 0) {
    record_.output_tokens_source = "usage";
  } else if (tokenizer) {
    record_.output_tokens = int64_t(tokenizer->encode(record_.generated_text).size());
    record_.output_tokens_source = "tokenizer";
  } else {
    record_.output_tokens = int64_t(record_.chunks);
    record_.output_tokens_source = "chunks";
  }
}

nlohmann::json to_json(const RequestRecord& r, bool with_itl) {
  nlohmann::json j = {{"index", r.index},
                      {"success", r.success},
                      {"http_status", r.http_status},
                      {"prompt_len", r.prompt_len},
                      {"expected_output_len", r.expected_output_len},
                      {"output_tokens", r.output_tokens},
                      {"output_tokens_source", r.output_tokens_source},
                      {"server_prompt_tokens", r.server_prompt_tokens},
                      {"cached_prompt_tokens", r.cached_prompt_tokens},
                      {"start_s", r.start_s},
                      {"end_s", r.end_s},
                      {"ttft_s", r.ttft_s},
                      {"tpot_s", r.tpot_s()},
                      {"e2el_s", r.e2el_s},
                      {"chunks", r.chunks},
                      {"finish_reason", r.finish_reason}};
  if (!r.success) j["error"] = r.error;
  if (with_itl) j["itl_s"] = r.itl_s;
  return j;
}

}  // namespace ossrt::bench
