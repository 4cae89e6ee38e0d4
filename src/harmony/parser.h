#pragma once
// Streaming Harmony parser: completion token ids -> message events (docs/reference/SPEC.md 5.9,
// docs/reference/SERVING.md 4).
//
// Feed it the tokens sampled after a prompt that ended with `<|start|>assistant`, one at a time.
// It never throws and never stops: whatever the model emits, it resynchronises and turns stray
// text into plain content, counting each recovery so the server can report it. The text of a
// special token never appears in content: specials are structure, or dropped (and counted).
//
// Recovery policy (each counted in RecoveryCounts):
//  - text where `<|start|>` was expected        -> a new assistant header begins there
//  - a header ended by <|end|>/<|call|>/<|return|>/<|endoftext|> instead of <|message|>
//                                               -> its text becomes the message content
//                                                  (a `<|channel|>NAME` in it still sets the channel)
//  - a header longer than kMaxHeaderTokens tokens, or holding a newline (no real header does)
//                                               -> its text becomes content, content continues
//  - a header without role, with an empty/unknown channel, or with junk words -> best effort
//                                                  fields; unknown channels become "" (plain content)
//  - `<|start|>` or `<|channel|>` inside content -> the message ends (terminator Cut), a new
//                                                  header begins
//  - <|message|>, <|constrain|>, reserved or other specials where they mean nothing -> dropped
// A message with channel "" is plain content: the server shows it as `content` (docs/reference/SERVING.md 4: treat
// stray text as content).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "harmony/conversation.h"

namespace ossrt {
class Tokenizer;
class IncrementalDecoder;
}  // namespace ossrt

namespace ossrt::harmony {

// How a message ended. Cut: no terminator token (the stream ended, or the model began a new
// message without closing this one).
enum class Terminator { End, Call, Return, EndOfText, Cut };
std::string_view terminator_name(Terminator terminator);  // "end" | "call" | "return" | ...

struct MessageStart {
  Role role = Role::Assistant;
  std::string author;  // tool name for Role::Tool, else empty
  std::string channel;
  std::string recipient;
  std::string content_type;
  bool operator==(const MessageStart&) const = default;
};
struct ContentDelta {
  std::string text;  // complete UTF-8, never empty
  bool operator==(const ContentDelta&) const = default;
};
struct MessageEnd {
  Terminator terminator = Terminator::End;
  bool operator==(const MessageEnd&) const = default;
};
using ParserEvent = std::variant<MessageStart, ContentDelta, MessageEnd>;

struct ParsedMessage {
  Role role = Role::Assistant;
  std::string author;
  std::string channel;
  std::string recipient;
  std::string content_type;
  std::string content;
  Terminator terminator = Terminator::Cut;
  RecipientPlacement recipient_placement = RecipientPlacement::Auto;
  bool operator==(const ParsedMessage&) const = default;

  // For history: the native message to render back (a stored <|return|> renders as <|end|>).
  Message to_message() const;
};

struct RecoveryCounts {
  int missing_start = 0;         // text or a header where <|start|> was expected
  int header_not_closed = 0;     // header ended by a terminator instead of <|message|>
  int header_too_long = 0;       // header over the token cap or with a newline
  int malformed_header = 0;      // missing role, empty/unknown channel, junk words, ...
  int unterminated_message = 0;  // content interrupted by <|start|> / <|channel|>
  int stray_special = 0;         // a special token dropped because it meant nothing there
  // Not a model error (max_tokens or a client stop), so not in total(): the stream ended inside
  // a message.
  int cut_at_finish = 0;

  int total() const {
    return missing_start + header_not_closed + header_too_long + malformed_header + unterminated_message +
           stray_special;
  }
  bool operator==(const RecoveryCounts&) const = default;
};

class StreamParser {
 public:
  // Real headers are a handful of tokens; anything longer is text that lost its header.
  static constexpr size_t kMaxHeaderTokens = 128;

  // `initial`: the role whose header the prompt opened (`<|start|>assistant`); nullopt when the
  // ids start at a `<|start|>` (parsing a whole rendered conversation).
  explicit StreamParser(std::shared_ptr<const Tokenizer> tokenizer, std::optional<Role> initial = Role::Assistant);
  ~StreamParser();
  StreamParser(StreamParser&&) noexcept;
  StreamParser& operator=(StreamParser&&) noexcept;

  std::vector<ParserEvent> push(int32_t id);
  // End of stream: closes an open header or message (Cut) and flushes undecoded bytes.
  // Further push() calls after finish() start a new, role-less stream state.
  std::vector<ParserEvent> finish();

  // Every message so far, in order; an open message (no terminator yet) is last, with
  // terminator Cut until it closes.
  const std::vector<ParsedMessage>& messages() const { return messages_; }
  // The message being received (header parsed, no terminator yet), if any.
  const ParsedMessage* open_message() const;
  const RecoveryCounts& recoveries() const { return recoveries_; }
  // Tokens held in the pending header; never above kMaxHeaderTokens (the memory bound).
  size_t pending_header_tokens() const { return header_ids_.size(); }

 private:
  enum class State { ExpectStart, Header, Content };

  bool is_ordinary(int32_t id) const;  // plain BPE text (not special, not out of range)
  void begin_header(std::optional<Role> preset_role);
  void handle_expect_start(int32_t id, std::vector<ParserEvent>& out);
  void handle_header(int32_t id, std::vector<ParserEvent>& out);
  void handle_content(int32_t id, std::vector<ParserEvent>& out);
  void complete_header(std::vector<ParserEvent>& out);
  void recover_header_as_content(std::vector<ParserEvent>& out, bool keep_if_empty);
  void open_message_from(MessageStart start, RecipientPlacement placement, std::vector<ParserEvent>& out);
  void append_content(std::string text, std::vector<ParserEvent>& out);
  void close_message(Terminator terminator, std::vector<ParserEvent>& out);

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<IncrementalDecoder> decoder_;
  State state_ = State::ExpectStart;
  std::optional<Role> header_role_;  // role preset for the header being collected
  std::vector<int32_t> header_ids_;
  std::string header_text_;  // decoded header, specials spelled out
  bool header_has_text_ = false;
  std::vector<ParsedMessage> messages_;
  bool message_open_ = false;
  RecoveryCounts recoveries_;
};

// Batch form: push every id, then finish().
struct ParseResult {
  std::vector<ParsedMessage> messages;
  RecoveryCounts recoveries;
};
ParseResult parse_completion(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<int32_t>& ids,
                             std::optional<Role> initial = Role::Assistant);

}  // namespace ossrt::harmony
