#pragma once
// The Responses API's memory for previous_response_id and GET /v1/responses/{id}: a map bounded
// in count, in bytes and in time (docs/reference/SERVING.md 1), whose entries belong to the API key that made
// them. A response is a capability (whoever holds its id may read and continue it), so ids are
// unguessable (server/random_id.h) and a key other than the owner's gets "not found", exactly as
// for an id that never existed. `store:false` responses never enter it.
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

struct ResponseStoreLimits {
  size_t capacity = 1024;             // entries
  uint64_t max_bytes = 512ull << 20;  // approximate serialized size of all entries
  std::chrono::seconds ttl{3600};
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreLimits limits) : limits_(limits) {}

  // `owner` identifies the credential that made the response ("" without auth); see owner_of().
  // An entry larger than max_bytes on its own is not stored (false).
  bool put(const std::string& id, const std::string& owner, StoredResponse value);
  // nullopt when unknown, expired, or owned by someone else.
  std::optional<StoredResponse> get(const std::string& id, const std::string& owner);
  size_t size() const;
  uint64_t bytes() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    StoredResponse value;
    std::string owner;
    uint64_t bytes = 0;
    Clock::time_point stored;
    std::list<std::string>::iterator order;
  };
  void evict(Clock::time_point now);
  void erase(std::unordered_map<std::string, Entry>::iterator it);

  ResponseStoreLimits limits_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, Entry> entries_;
  uint64_t bytes_ = 0;
};

}  // namespace ossrt::server
