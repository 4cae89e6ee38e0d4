#pragma once
// Incremental parser of a text/event-stream body (the WHATWG HTML "server-sent events" format that
// OpenAI-compatible servers stream): bytes arrive in whatever pieces the network delivers, so an
// event, a line, or a CR LF pair may be split anywhere. Lines end with CR LF, LF or CR; `field:
// value` lines build the event (one leading space of the value dropped; several `data` lines join
// with LF); lines starting with `:` are comments (keep-alive pings); a blank line dispatches the
// event when it has data. An unterminated event at the end of the stream is not dispatched (the
// spec says so), but pending() tells the caller that one was cut off.
#include <functional>
#include <string>
#include <string_view>

namespace ossrt::bench {

struct SseEvent {
  std::string event;  // the `event:` field ("" = the default "message")
  std::string data;   // `data:` lines joined by LF
  std::string id;
};

class SseParser {
 public:
  using Handler = std::function<void(const SseEvent&)>;
  explicit SseParser(Handler on_event) : on_event_(std::move(on_event)) {}

  // Parses the next bytes of the stream; calls the handler for every event they complete.
  void feed(std::string_view bytes);
  // True when bytes of an event (or of a line) were read but no blank line ended it.
  bool pending() const { return !line_.empty() || has_data_ || !event_.event.empty(); }
  size_t comments() const { return comments_; }

 private:
  void line(std::string_view text);

  Handler on_event_;
  std::string line_;       // the current line so far
  bool after_cr_ = false;  // the last byte was CR: a following LF belongs to the same line end
  SseEvent event_;
  bool has_data_ = false;
  size_t comments_ = 0;
};

}  // namespace ossrt::bench
