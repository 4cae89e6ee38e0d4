#pragma once
// The Responses API's memory for previous_response_id and GET /v1/responses/{id}: a bounded,
// TTL-limited map (SERVING.md 1). Bounded in count so a client that never deletes cannot grow the
// server without limit; `store:false` responses never enter it.
#include <nlohmann/json.hpp>

#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace ossrt::server {

struct StoredResponse {
  nlohmann::json response;          // the object returned to the client
  nlohmann::ordered_json messages;  // the conversation so far, as chat-completions messages
};

class ResponseStore {
 public:
  ResponseStore(size_t capacity, std::chrono::seconds ttl) : capacity_(capacity), ttl_(ttl) {}

  void put(const std::string& id, StoredResponse value);
  std::optional<StoredResponse> get(const std::string& id);
  // Updates the stored response object (e.g. status cancelled); false when unknown.
  bool update_response(const std::string& id, const nlohmann::json& response);
  size_t size() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    StoredResponse value;
    Clock::time_point stored;
    std::list<std::string>::iterator order;
  };
  void evict_expired(Clock::time_point now);

  size_t capacity_;
  std::chrono::seconds ttl_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ossrt::server
