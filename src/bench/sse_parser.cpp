#include "bench/sse_parser.h"

namespace ossrt::bench {

void SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the LF of a CR LF split across two reads
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      std::string text;
      text.swap(line_);
      line(text);
      continue;
    }
    line_.push_back(c);
  }
}

void SseParser::line(std::string_view text) {
  if (text.empty()) {
    if (has_data_) {
      SseEvent done;
      std::swap(done, event_);
      has_data_ = false;
      on_event_(done);
    } else {
      event_ = SseEvent{};  // an event without data is dropped (spec), its fields with it
    }
    return;
  }
  if (text.front() == ':') {
    ++comments_;
    return;
  }
  const size_t colon = text.find(':');
  std::string_view field = text.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = text.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) event_.data.push_back('\n');
    event_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_.event.assign(value);
  } else if (field == "id") {
    event_.id.assign(value);
  }
  // `retry` and unknown fields are ignored (spec).
}

}  // namespace ossrt::bench
