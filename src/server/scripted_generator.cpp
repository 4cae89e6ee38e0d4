#include "server/scripted_generator.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.h"

namespace ossrt::server {

using Clock = std::chrono::steady_clock;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int32_t> parse_reply_ids(const nlohmann::json& given, const ScriptCodec& codec, const std::string& where) {
  const nlohmann::json entry = given.is_array() ? nlohmann::json{{"ids", given}} : given;
  OSSRT_CHECK(entry.is_object(), "{}: expected an object or an array of ids", where);
  if (entry.contains("ids")) {
    const auto& ids = entry["ids"];
    OSSRT_CHECK(ids.is_array(), "{}.ids: expected an array of token ids", where);
    std::vector<int32_t> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      OSSRT_CHECK(ids[i].is_number_integer(), "{}.ids[{}]: expected an integer token id", where, i);
      out.push_back(ids[i].get<int32_t>());
    }
    return out;
  }
  OSSRT_CHECK(entry.contains("text") && entry["text"].is_string(),
              "{}: a reply needs \"ids\" (array) or \"text\" (string)", where);
  OSSRT_CHECK(bool(codec.encode_with_special), "{}.text: no tokenizer to encode script text", where);
  return codec.encode_with_special(entry["text"].get<std::string>());
}

}  // namespace

ScriptedGeneratorOptions parse_script(const nlohmann::json& script, const ScriptCodec& codec,
                                      const std::string& source) {
  ScriptedGeneratorOptions options;
  const nlohmann::json* replies = &script;
  if (script.is_object()) {
    OSSRT_CHECK(script.contains("replies"), "{}: missing \"replies\"", source);
    replies = &script["replies"];
    auto int_field = [&](const char* key, int fallback) {
      if (!script.contains(key)) return fallback;
      OSSRT_CHECK(script[key].is_number_integer() && script[key].get<int64_t>() >= 0,
                  "{}: \"{}\" must be a non-negative integer", source, key);
      return script[key].get<int>();
    };
    options.token_interval = std::chrono::microseconds(int64_t(int_field("token_interval_ms", 2)) * 1000);
    options.kv_blocks = int_field("kv_blocks", options.kv_blocks);
    options.block_size = std::max(1, int_field("block_size", options.block_size));
  }
  OSSRT_CHECK(replies->is_array() && !replies->empty(), "{}: \"replies\" must be a non-empty array", source);
  for (size_t i = 0; i < replies->size(); ++i) {
    const auto& entry = (*replies)[i];
    std::string where = fmt::format("{}: replies[{}]", source, i);
    ScriptedReply reply;
    if (entry.is_object() && entry.contains("match")) {
      OSSRT_CHECK(entry["match"].is_string() && !entry["match"].get<std::string>().empty(),
                  "{}.match: expected a non-empty string", where);
      reply.match = entry["match"].get<std::string>();
    }
    reply.ids = parse_reply_ids(entry, codec, where);
    options.replies.push_back(std::move(reply));
  }
  return options;
}

ScriptedGenerator::ScriptedGenerator(ScriptedGeneratorOptions options, ScriptCodec codec)
    : options_(std::move(options)), codec_(std::move(codec)) {
  OSSRT_CHECK(!options_.replies.empty(), "scripted generator: no replies");
  free_blocks_ = options_.kv_blocks;
  worker_ = std::thread([this] { worker_loop(); });
}

ScriptedGenerator::~ScriptedGenerator() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

int ScriptedGenerator::blocks_for(int tokens) const { return (tokens + options_.block_size - 1) / options_.block_size; }

const std::vector<int32_t>* ScriptedGenerator::choose_script(const GenerationRequest& request) {
  const ScriptedReply* best = nullptr;
  size_t best_pos = 0;
  bool any_match = std::any_of(options_.replies.begin(), options_.replies.end(),
                               [](const ScriptedReply& r) { return !r.match.empty(); });
  if (any_match && codec_.decode) {
    std::string prompt = codec_.decode(request.prompt_ids);
    for (const auto& reply : options_.replies) {
      if (reply.match.empty()) continue;
      size_t pos = prompt.rfind(reply.match);
      if (pos != std::string::npos && (!best || pos >= best_pos)) {
        best = &reply;
        best_pos = pos;
      }
    }
  }
  if (best) return &best->ids;
  std::vector<const ScriptedReply*> defaults;
  for (const auto& reply : options_.replies)
    if (reply.match.empty()) defaults.push_back(&reply);
  if (defaults.empty()) return &options_.replies.front().ids;
  return &defaults[round_robin_++ % defaults.size()]->ids;
}

bool ScriptedGenerator::submit(GenerationRequest request, EventCallback on_event) {
  std::lock_guard lock(mu_);
  if (!accepting_ || int(waiting_.size()) >= options_.max_queue) return false;
  Sequence seq;
  seq.script = choose_script(request);
  seq.request = std::move(request);
  seq.on_event = std::move(on_event);
  waiting_.push_back(std::move(seq));
  wake_.notify_all();
  return true;
}

GenerationEvent ScriptedGenerator::final_event(const Sequence& seq, FinishReason reason) const {
  GenerationEvent ev;
  ev.finished = true;
  ev.finish_reason = reason;
  ev.prompt_tokens = int(seq.request.prompt_ids.size());
  ev.completion_tokens = seq.generated;
  auto now = Clock::now();
  auto scheduled = seq.scheduled == Clock::time_point{} ? now : seq.scheduled;
  ev.queue_time = seconds_between(seq.request.arrival, scheduled);
  ev.time_to_first_token =
      seq.first_token == Clock::time_point{} ? 0.0 : seconds_between(seq.request.arrival, seq.first_token);
  ev.e2e_latency = seconds_between(seq.request.arrival, now);
  return ev;
}

void ScriptedGenerator::cancel(const std::string& request_id) {
  std::lock_guard lock(mu_);
  auto abort = [&](Sequence& seq) {
    free_blocks_ += seq.blocks;
    seq.blocks = 0;
    cancelled_deliveries_.push_back({seq.on_event, final_event(seq, FinishReason::Abort)});
  };
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if (it->request.id == request_id) {
      abort(*it);
      running_.erase(it);
      wake_.notify_all();
      return;
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if (it->request.id == request_id) {
      abort(*it);
      waiting_.erase(it);
      wake_.notify_all();
      return;
    }
  }
}

GeneratorStats ScriptedGenerator::stats() const {
  std::lock_guard lock(mu_);
  GeneratorStats s;
  s.running = int(running_.size());
  s.waiting = int(waiting_.size());
  s.total_kv_blocks = options_.kv_blocks;
  s.free_kv_blocks = free_blocks_;
  s.kv_usage = options_.kv_blocks ? double(options_.kv_blocks - free_blocks_) / options_.kv_blocks : 0.0;
  return s;
}

int ScriptedGenerator::blocks_in_use() const {
  std::lock_guard lock(mu_);
  return options_.kv_blocks - free_blocks_;
}

void ScriptedGenerator::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  accepting_ = false;
  wake_.wait_for(lock, timeout, [&] { return running_.empty() && waiting_.empty(); });
  std::vector<std::string> rest;
  for (auto& s : running_) rest.push_back(s.request.id);
  for (auto& s : waiting_) rest.push_back(s.request.id);
  lock.unlock();
  for (const auto& id : rest) cancel(id);
}

// FCFS admission while a sequence slot and blocks for its prompt (+1 token) are free.
void ScriptedGenerator::admit_waiting() {
  while (!waiting_.empty() && int(running_.size()) < options_.max_num_seqs) {
    Sequence& seq = waiting_.front();
    int need = blocks_for(int(seq.request.prompt_ids.size()) + 1);
    if (need > free_blocks_) break;
    free_blocks_ -= need;
    seq.blocks = need;
    seq.scheduled = Clock::now();
    running_.push_back(std::move(seq));
    waiting_.pop_front();
  }
}

void ScriptedGenerator::step(std::vector<Delivery>& out) {
  admit_waiting();
  auto now = Clock::now();
  std::vector<Sequence> still_running;
  for (auto& seq : running_) {
    const auto& p = seq.request.sampling;
    const auto& script = *seq.script;
    GenerationEvent ev;
    FinishReason finish = FinishReason::None;
    if (seq.cursor >= script.size()) {
      if (p.ignore_eos)
        seq.cursor = 0;  // benchmarks: keep producing until max_tokens
      else
        finish = FinishReason::Stop;  // the script ended without a stop token: treat as EOS
    }
    if (finish == FinishReason::None) {
      int32_t id = script[seq.cursor++];
      bool is_stop = !p.ignore_eos && (std::count(options_.eos_ids.begin(), options_.eos_ids.end(), id) ||
                                       std::count(p.stop_token_ids.begin(), p.stop_token_ids.end(), id));
      if (seq.first_token == Clock::time_point{}) seq.first_token = now;
      seq.generated += 1;
      if (is_stop) {
        finish = FinishReason::Stop;
        ev.stop_token = id;
      } else {
        ev.token_ids.push_back(id);
        if (p.logprobs >= 0) ev.logprobs.push_back(TokenLogprob{id, 0.0f, {}});
        if (seq.generated >= p.max_tokens) finish = FinishReason::Length;
      }
      int need = blocks_for(int(seq.request.prompt_ids.size()) + seq.generated + 1);
      if (need > seq.blocks && free_blocks_ > 0) {
        free_blocks_ -= 1;
        seq.blocks += 1;
      }
    }
    if (finish != FinishReason::None) {
      GenerationEvent fin = final_event(seq, finish);
      fin.token_ids = std::move(ev.token_ids);
      fin.logprobs = std::move(ev.logprobs);
      fin.stop_token = ev.stop_token;
      free_blocks_ += seq.blocks;
      seq.blocks = 0;
      out.push_back({seq.on_event, std::move(fin)});
    } else {
      out.push_back({seq.on_event, std::move(ev)});
      still_running.push_back(std::move(seq));
    }
  }
  running_ = std::move(still_running);
}

void ScriptedGenerator::worker_loop() {
  std::unique_lock lock(mu_);
  while (true) {
    wake_.wait(lock,
               [&] { return stopping_ || !running_.empty() || !waiting_.empty() || !cancelled_deliveries_.empty(); });
    if (stopping_) break;
    std::vector<Delivery> out = std::move(cancelled_deliveries_);
    cancelled_deliveries_.clear();
    step(out);
    bool idle = running_.empty() && waiting_.empty();
    lock.unlock();
    for (auto& d : out) d.callback(d.event);
    if (idle) wake_.notify_all();  // drain() waits for this
    std::this_thread::sleep_for(options_.token_interval);
    lock.lock();
  }
}

}  // namespace ossrt::server
