#include "server/response_store.h"

namespace ossrt::server {

void ResponseStore::evict_expired(Clock::time_point now) {
  while (!order_.empty()) {
    auto it = entries_.find(order_.front());
    if (it != entries_.end() && now - it->second.stored < ttl_ && entries_.size() <= capacity_) break;
    if (it != entries_.end()) entries_.erase(it);
    order_.pop_front();
  }
}

void ResponseStore::put(const std::string& id, StoredResponse value) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  auto now = Clock::now();
  if (auto it = entries_.find(id); it != entries_.end()) {
    order_.erase(it->second.order);
    entries_.erase(it);
  }
  order_.push_back(id);
  entries_[id] = Entry{std::move(value), now, std::prev(order_.end())};
  evict_expired(now);
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  evict_expired(Clock::now());
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.value;
}

bool ResponseStore::update_response(const std::string& id, const nlohmann::json& response) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  it->second.value.response = response;
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace ossrt::server
