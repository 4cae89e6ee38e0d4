// The streaming parser's state machine. Its one hard rule: every token id, in any order, moves it
// to a well-defined state without throwing, so a model glitch can never fail a request.
#include "harmony/parser.h"

#include "harmony/header_parser.h"
#include "harmony/special_tokens.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::harmony {
namespace {

std::optional<Terminator> terminator_for(int32_t id) {
  switch (id) {
    case kEndId: return Terminator::End;
    case kCallId: return Terminator::Call;
    case kReturnId: return Terminator::Return;
    case kEndOfTextId: return Terminator::EndOfText;
    default: return std::nullopt;
  }
}

bool is_blank(std::string_view text) { return text.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

}  // namespace

std::string_view terminator_name(Terminator terminator) {
  switch (terminator) {
    case Terminator::End: return "end";
    case Terminator::Call: return "call";
    case Terminator::Return: return "return";
    case Terminator::EndOfText: return "endoftext";
    case Terminator::Cut: return "cut";
  }
  return "cut";
}

Message ParsedMessage::to_message() const {
  Message m;
  m.role = role;
  m.author_name = author;
  m.recipient = recipient;
  m.channel = channel;
  m.content_type = content_type;
  m.content = content;
  // Keep an explicit placement only where it differs from what Auto would render.
  const bool auto_after = role == Role::Assistant;
  const bool same_as_auto = recipient_placement == RecipientPlacement::Auto ||
                            (recipient_placement == RecipientPlacement::AfterChannel) == auto_after;
  m.recipient_placement = same_as_auto ? RecipientPlacement::Auto : recipient_placement;
  return m;
}

StreamParser::StreamParser(std::shared_ptr<const Tokenizer> tokenizer, std::optional<Role> initial)
    : tokenizer_(std::move(tokenizer)), decoder_(std::make_unique<IncrementalDecoder>(tokenizer_)) {
  if (initial) begin_header(initial);
}

StreamParser::~StreamParser() = default;
StreamParser::StreamParser(StreamParser&&) noexcept = default;
StreamParser& StreamParser::operator=(StreamParser&&) noexcept = default;

const ParsedMessage* StreamParser::open_message() const { return message_open_ ? &messages_.back() : nullptr; }

std::vector<ParserEvent> StreamParser::push(int32_t id) {
  std::vector<ParserEvent> out;
  switch (state_) {
    case State::ExpectStart: handle_expect_start(id, out); break;
    case State::Header: handle_header(id, out); break;
    case State::Content: handle_content(id, out); break;
  }
  return out;
}

std::vector<ParserEvent> StreamParser::finish() {
  std::vector<ParserEvent> out;
  if (state_ == State::Header && !header_ids_.empty()) {
    // Cut inside a header: its text is all there is of the message.
    ++recoveries_.cut_at_finish;
    if (header_has_text_) recover_header_as_content(out, /*keep_if_empty=*/false);
  } else if (state_ == State::Content && message_open_) {
    ++recoveries_.cut_at_finish;
  }
  if (state_ == State::Content) {
    append_content(decoder_->flush(), out);
    close_message(Terminator::Cut, out);
  }
  header_ids_.clear();
  header_text_.clear();
  header_has_text_ = false;
  header_role_.reset();
  state_ = State::ExpectStart;
  decoder_ = std::make_unique<IncrementalDecoder>(tokenizer_);
  return out;
}

void StreamParser::begin_header(std::optional<Role> preset_role) {
  state_ = State::Header;
  header_role_ = preset_role;
  header_ids_.clear();
  header_text_.clear();
  header_has_text_ = false;
  decoder_ = std::make_unique<IncrementalDecoder>(tokenizer_);
}

bool StreamParser::is_ordinary(int32_t id) const {
  return id >= 0 && id < tokenizer_->vocab_size() && !tokenizer_->is_special(id);
}

void StreamParser::handle_expect_start(int32_t id, std::vector<ParserEvent>& out) {
  if (id == kStartId) {
    begin_header(std::nullopt);
  } else if (id == kEndOfTextId) {
    // End of text between messages is a normal end of generation.
  } else if (is_ordinary(id) && is_blank(tokenizer_->token_bytes(id))) {
    // Whitespace between messages carries nothing; ignoring it keeps a "\n" from opening an
    // empty message.
  } else if (id == kChannelId || id == kMessageId || is_ordinary(id)) {
    // The model skipped `<|start|>assistant`: what follows is still its message.
    ++recoveries_.missing_start;
    begin_header(Role::Assistant);
    handle_header(id, out);
  } else {
    ++recoveries_.stray_special;
  }
}

void StreamParser::handle_header(int32_t id, std::vector<ParserEvent>& out) {
  if (id == kMessageId) {
    complete_header(out);
    return;
  }
  if (id == kStartId) {
    if (header_has_text_) {
      // Text that never got its <|message|>: keep it as content, then start over.
      ++recoveries_.header_not_closed;
      recover_header_as_content(out, /*keep_if_empty=*/false);
      close_message(Terminator::Cut, out);
    } else {
      ++recoveries_.stray_special;
    }
    begin_header(std::nullopt);
    return;
  }
  if (std::optional<Terminator> terminator = terminator_for(id)) {
    if (!header_ids_.empty()) {
      // Non-strict harmony: a header closed by a terminator is the message's text
      // (a refusal with no channel, `<|channel|>final The answer<|return|>`).
      ++recoveries_.header_not_closed;
      recover_header_as_content(out, /*keep_if_empty=*/false);
      close_message(*terminator, out);
    } else if (*terminator != Terminator::EndOfText) {
      ++recoveries_.stray_special;
    }
    state_ = State::ExpectStart;
    header_role_.reset();
    return;
  }
  if (id == kChannelId || id == kConstrainId) {
    header_text_ += decoder_->flush();
    header_text_ += (id == kChannelId ? kChannelText : kConstrainText);
    header_ids_.push_back(id);
  } else if (is_ordinary(id)) {
    header_text_ += decoder_->push(id);
    header_ids_.push_back(id);
    header_has_text_ = true;
    if (is_blank(header_text_)) {
      // Leading whitespace is not part of any header (and must not trip the newline rule).
      header_text_.clear();
      header_ids_.clear();
      header_has_text_ = false;
      return;
    }
  } else {
    ++recoveries_.stray_special;
    return;
  }
  // No real header holds a newline or runs this long: it is text that lost its header. Deciding
  // now bounds memory and lets the text stream instead of waiting for a terminator.
  if (header_ids_.size() >= kMaxHeaderTokens || header_text_.find('\n') != std::string::npos) {
    ++recoveries_.header_too_long;
    // The content continues after this point, so the message must exist even if still empty.
    recover_header_as_content(out, /*keep_if_empty=*/true);
  }
}

void StreamParser::complete_header(std::vector<ParserEvent>& out) {
  header_text_ += decoder_->flush();
  HeaderParse header = parse_header(header_text_, header_role_);
  if (header.anomalies > 0) ++recoveries_.malformed_header;
  header_ids_.clear();
  header_text_.clear();
  header_has_text_ = false;
  header_role_.reset();
  open_message_from(std::move(header.start), header.placement, out);
  state_ = State::Content;
}

void StreamParser::recover_header_as_content(std::vector<ParserEvent>& out, bool keep_if_empty) {
  SalvagedHeader salvaged = salvage_header(header_text_, /*opened_by_start=*/!header_role_.has_value());
  if (!keep_if_empty && salvaged.text.empty() && salvaged.channel.empty()) {
    // Only whitespace before a terminator: nothing to show, so no empty message either.
    header_ids_.clear();
    header_text_.clear();
    header_has_text_ = false;
    header_role_.reset();
    return;
  }
  MessageStart start;
  start.role = header_role_.value_or(Role::Assistant);
  start.channel = std::move(salvaged.channel);
  header_ids_.clear();
  header_text_.clear();
  header_has_text_ = false;
  header_role_.reset();
  // The decoder keeps any incomplete UTF-8 tail: it belongs to the content that follows.
  open_message_from(std::move(start), RecipientPlacement::Auto, out);
  append_content(std::move(salvaged.text), out);
  state_ = State::Content;
}

void StreamParser::handle_content(int32_t id, std::vector<ParserEvent>& out) {
  if (std::optional<Terminator> terminator = terminator_for(id)) {
    append_content(decoder_->flush(), out);
    close_message(*terminator, out);
    state_ = State::ExpectStart;
    return;
  }
  if (id == kStartId || id == kChannelId) {
    // The model began a new message without closing this one: resynchronise there.
    append_content(decoder_->flush(), out);
    ++recoveries_.unterminated_message;
    close_message(Terminator::Cut, out);
    if (id == kStartId) {
      begin_header(std::nullopt);
    } else {
      begin_header(Role::Assistant);
      handle_header(id, out);
    }
    return;
  }
  if (!is_ordinary(id)) {
    ++recoveries_.stray_special;
    return;
  }
  append_content(decoder_->push(id), out);
}

void StreamParser::open_message_from(MessageStart start, RecipientPlacement placement, std::vector<ParserEvent>& out) {
  ParsedMessage message;
  message.role = start.role;
  message.author = start.author;
  message.channel = start.channel;
  message.recipient = start.recipient;
  message.content_type = start.content_type;
  message.recipient_placement = placement;
  messages_.push_back(std::move(message));
  message_open_ = true;
  out.emplace_back(std::move(start));
}

void StreamParser::append_content(std::string text, std::vector<ParserEvent>& out) {
  if (text.empty() || !message_open_) return;
  messages_.back().content += text;
  out.emplace_back(ContentDelta{std::move(text)});
}

void StreamParser::close_message(Terminator terminator, std::vector<ParserEvent>& out) {
  if (!message_open_) return;
  messages_.back().terminator = terminator;
  message_open_ = false;
  out.emplace_back(MessageEnd{terminator});
}

ParseResult parse_completion(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<int32_t>& ids,
                             std::optional<Role> initial) {
  StreamParser parser(std::move(tokenizer), initial);
  for (int32_t id : ids) parser.push(id);
  parser.finish();
  return ParseResult{parser.messages(), parser.recoveries()};
}

}  // namespace ossrt::harmony
