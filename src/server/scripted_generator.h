#pragma once
// A Generator that replays scripted token ids instead of running a model. Random weights never
// emit Harmony, so this is how the server's whole output path (Harmony parser -> OpenAI JSON/SSE)
// is tested end to end with real clients, including malformed Harmony. It behaves like a small
// engine: one worker thread steps every `token_interval`, each running request gets one token
// per step, at most `max_num_seqs` run at once, the rest wait in a bounded queue, and a KV-block
// ledger (blocks for prompt + generated tokens) lets tests check that nothing leaks after
// finishes and cancels.
//
// Script file (JSON), given to `ossrt serve --scripted-replies FILE`:
//   {"replies": [ {"match": "weather", "text": "<|channel|>commentary to=functions.get_weather ..."},
//                 {"ids": [200005, 17196, ...]} ],
//    "token_interval_ms": 2, "kv_blocks": 4096, "block_size": 16}
// A reply is either "ids" or "text" (Harmony spelled out; encoded with special tokens). A reply
// with "match" is chosen when its string occurs in the decoded prompt; when several match, the one
// whose string occurs LAST wins (so in a tool round trip the newest turn decides). Replies
// without "match" are used round-robin otherwise. A bare JSON array of id arrays is also accepted.
#include <nlohmann/json_fwd.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"

namespace ossrt::server {

struct ScriptedReply {
  std::string match;  // empty: a default (round-robin) reply
  std::vector<int32_t> ids;
};

struct ScriptedGeneratorOptions {
  std::vector<ScriptedReply> replies;
  std::chrono::microseconds token_interval{2000};
  int max_num_seqs = 256;
  int max_queue = 4096;
  int max_model_len = 8192;
  int vocab_size = 201088;  // gpt-oss's embedding rows
  int kv_blocks = 65536;
  int block_size = 16;
  std::vector<int32_t> eos_ids = {200002, 200012, 199999};
};

// Text <-> ids for script "text" entries and "match" lookups (the server passes its tokenizer).
struct ScriptCodec {
  std::function<std::vector<int32_t>(const std::string&)> encode_with_special;
  std::function<std::string(std::span<const int32_t>)> decode;
};

// Parses a script (see above). Throws ossrt::Error naming the field on malformed input.
ScriptedGeneratorOptions parse_script(const nlohmann::json& script, const ScriptCodec& codec,
                                      const std::string& source);

class ScriptedGenerator : public Generator {
 public:
  ScriptedGenerator(ScriptedGeneratorOptions options, ScriptCodec codec);
  ~ScriptedGenerator() override;

  bool submit(GenerationRequest request, EventCallback on_event) override;
  void cancel(const std::string& request_id) override;
  GeneratorStats stats() const override;
  int max_model_len() const override { return options_.max_model_len; }
  int vocab_size() const override { return options_.vocab_size; }
  void drain(std::chrono::milliseconds timeout) override;

  // Blocks held by running requests right now (0 when idle: the leak check).
  int blocks_in_use() const;

 private:
  struct Sequence {
    GenerationRequest request;
    EventCallback on_event;
    const std::vector<int32_t>* script = nullptr;
    size_t cursor = 0;  // next script position
    int generated = 0;  // tokens emitted (and stop tokens consumed)
    int blocks = 0;     // KV blocks held
    std::chrono::steady_clock::time_point scheduled, first_token;
  };
  struct Delivery {  // callbacks run after the lock is released
    EventCallback callback;
    GenerationEvent event;
  };

  void worker_loop();
  void step(std::vector<Delivery>& out);
  void admit_waiting();
  int blocks_for(int tokens) const;
  const std::vector<int32_t>* choose_script(const GenerationRequest& request);
  GenerationEvent final_event(const Sequence& seq, FinishReason reason) const;

  ScriptedGeneratorOptions options_;
  ScriptCodec codec_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Sequence> waiting_;
  std::vector<Sequence> running_;
  std::vector<Delivery> cancelled_deliveries_;
  int free_blocks_ = 0;
  size_t round_robin_ = 0;
  bool accepting_ = true, stopping_ = false;
  std::thread worker_;
};

}  // namespace ossrt::server
