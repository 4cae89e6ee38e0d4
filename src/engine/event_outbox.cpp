#include "engine/event_outbox.h"

#include <spdlog/spdlog.h>

#include <exception>

namespace ossrt {

void EventOutbox::flush() {
  // Swapped out first: nothing a callback does reaches held_, but a list that is being iterated
  // must never be the one push() appends to.
  delivering_.swap(held_);
  for (Held& h : delivering_) {
    try {
      h.sink->callback(h.event);
    } catch (const std::exception& e) {
      spdlog::error("request {}: event callback threw: {}", h.sink->request_id, e.what());
    }
  }
  delivering_.clear();
}

}  // namespace ossrt
