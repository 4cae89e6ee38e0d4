#include "server/response_store.h"

namespace ossrt::server {
namespace {

// What an entry costs, approximately: its JSON text (nlohmann's in-memory form is a small
// multiple of it, the same for every entry, so the budget orders and bounds them alike).
uint64_t approximate_bytes(const std::string& id, const StoredResponse& value) {
  auto dumped = [](const auto& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size(); };
  return id.size() + dumped(value.response) + dumped(value.messages);
}

}  // namespace

void ResponseStore::erase(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  entries_.erase(it);
}

void ResponseStore::evict(Clock::time_point now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    const bool keep =
        now - it->second.stored < limits_.ttl && entries_.size() <= limits_.capacity && bytes_ <= limits_.max_bytes;
    if (keep) break;
    erase(it);
  }
}

bool ResponseStore::put(const std::string& id, const std::string& owner, StoredResponse value) {
  if (limits_.capacity == 0) return false;
  const uint64_t bytes = approximate_bytes(id, value);
  if (bytes > limits_.max_bytes) return false;
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  if (auto it = entries_.find(id); it != entries_.end()) erase(it);
  order_.push_back(id);
  entries_[id] = Entry{std::move(value), owner, bytes, now, std::prev(order_.end())};
  bytes_ += bytes;
  evict(now);
  return true;
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id, const std::string& owner) {
  std::lock_guard lock(mu_);
  evict(Clock::now());
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.owner != owner) return std::nullopt;
  return it->second.value;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

uint64_t ResponseStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace ossrt::server
