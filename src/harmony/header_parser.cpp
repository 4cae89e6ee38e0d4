#include "harmony/header_parser.h"

#include <array>
#include <vector>

#include "harmony/special_tokens.h"

namespace ossrt::harmony {
namespace {

constexpr std::array<std::string_view, 3> kKnownChannels = {"analysis", "commentary", "final"};

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_ascii_space(text[i])) ++i;
    size_t start = i;
    while (i < text.size() && !is_ascii_space(text[i])) ++i;
    if (i > start) words.emplace_back(text.substr(start, i - start));
  }
  return words;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  for (size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
}

struct ChannelCut {
  std::string channel_word;  // raw word after the first <|channel|>; empty if none / empty
  bool found = false;
  size_t marker_pos = std::string::npos;  // where the first <|channel|> was
  int extra_markers = 0;
  std::string rest;  // header with every <|channel|> (and the first one's word) replaced by " "
};

ChannelCut cut_channel(std::string_view header) {
  ChannelCut cut;
  cut.rest = std::string(header);
  size_t pos = cut.rest.find(kChannelText);
  if (pos == std::string::npos) return cut;
  cut.found = true;
  cut.marker_pos = pos;
  size_t word_start = pos + kChannelText.size();
  size_t word_end = word_start;
  while (word_end < cut.rest.size() && !is_ascii_space(cut.rest[word_end]) && cut.rest[word_end] != '<') {
    ++word_end;
  }
  cut.channel_word = cut.rest.substr(word_start, word_end - word_start);
  cut.rest.replace(pos, word_end - pos, " ");
  for (size_t extra = cut.rest.find(kChannelText); extra != std::string::npos;
       extra = cut.rest.find(kChannelText, extra)) {
    cut.rest.replace(extra, kChannelText.size(), " ");
    ++cut.extra_markers;
  }
  return cut;
}

}  // namespace

std::string normalize_channel(std::string_view word) {
  for (std::string_view known : kKnownChannels) {
    if (word == known) return std::string(known);
  }
  std::string found;
  for (std::string_view known : kKnownChannels) {
    if (word.find(known) != std::string_view::npos) {
      if (!found.empty()) return "";  // ambiguous ("analysisfinal"): trust neither
      found = known;
    }
  }
  return found;
}

HeaderParse parse_header(std::string_view header, std::optional<Role> preset) {
  HeaderParse result;
  ChannelCut cut = cut_channel(header);
  result.anomalies += cut.extra_markers;
  if (cut.found) {
    result.start.channel = normalize_channel(cut.channel_word);
    if (result.start.channel != cut.channel_word) ++result.anomalies;
  }

  // A constrain marker glued to the previous word (`to=x<|constrain|>json`) starts a new word.
  std::string rest = cut.rest;
  replace_all(rest, kConstrainText, std::string(" ") + std::string(kConstrainText));
  std::vector<std::string> words = split_words(rest);

  size_t next = 0;
  if (preset) {
    result.start.role = *preset;
    if (next < words.size() && words[next] == role_name(*preset)) ++next;
  } else if (next < words.size() && !words[next].starts_with("to=") && !words[next].starts_with(kConstrainText)) {
    const std::string& first = words[next++];
    std::string_view role_part = first;
    std::string_view name_part;
    if (size_t colon = first.find(':'); colon != std::string::npos) {
      role_part = std::string_view(first).substr(0, colon);
      name_part = std::string_view(first).substr(colon + 1);
    }
    std::optional<Role> role = role_from_name(role_part);
    if (role && *role != Role::Tool) {
      result.start.role = *role;
      result.start.author = std::string(name_part);
    } else {
      // Tool results are authored by the tool's name: `functions.get_weather`, `browser.search`.
      result.start.role = Role::Tool;
      result.start.author = first;
    }
  } else {
    result.start.role = Role::Assistant;
    ++result.anomalies;
  }

  std::vector<std::string> bare;
  size_t recipient_word_pos = std::string::npos;
  for (size_t i = next; i < words.size(); ++i) {
    std::string& word = words[i];
    if (word.starts_with("to=")) {
      if (!result.start.recipient.empty() || word.size() == 3) {
        ++result.anomalies;
      } else {
        result.start.recipient = word.substr(3);
        recipient_word_pos = header.find(word);
      }
    } else if (word.starts_with(kConstrainText)) {
      std::string type = word;
      // `<|constrain|> json`: the marker and its format were split by a space.
      if (type == kConstrainText && i + 1 < words.size() && !words[i + 1].starts_with("to=")) {
        type += words[++i];
      }
      if (!result.start.content_type.empty()) {
        ++result.anomalies;
      } else {
        result.start.content_type = type;
      }
    } else {
      bare.push_back(word);
    }
  }
  if (!bare.empty()) {
    size_t used = 0;
    if (result.start.content_type.empty()) {
      // harmony: a lone word is the recipient. Not on `final`, which is never addressed to a
      // tool: there it can only be a content type (`<|channel|>final json`).
      if (result.start.recipient.empty() && bare.size() == 1 && result.start.channel != "final") {
        result.start.recipient = bare[0];
        recipient_word_pos = header.find(bare[0]);
        used = 1;
      } else {
        result.start.content_type = bare.back();
        used = 1;
        if (result.start.recipient.empty() && bare.size() >= 2) {
          result.start.recipient = bare[bare.size() - 2];
          recipient_word_pos = header.find(bare[bare.size() - 2]);
          used = 2;
        }
      }
    }
    result.anomalies += static_cast<int>(bare.size() - used);
  }

  // "Channel must be included for every message" is the rule for what the model writes.
  if (!cut.found && result.start.role == Role::Assistant) ++result.anomalies;

  if (!result.start.recipient.empty() && cut.found && !result.start.channel.empty()) {
    result.placement =
        recipient_word_pos < cut.marker_pos ? RecipientPlacement::BeforeChannel : RecipientPlacement::AfterChannel;
  }
  return result;
}

SalvagedHeader salvage_header(std::string_view header, bool opened_by_start) {
  SalvagedHeader salvaged;
  std::string text(header);
  if (opened_by_start) {
    size_t end = 0;
    while (end < text.size() && !is_ascii_space(text[end]) && text[end] != '<') ++end;
    if (role_from_name(std::string_view(text).substr(0, end))) text.erase(0, end);
  } else if (text.starts_with("assistant<|")) {
    // A header-less message can still open with the role the model meant to write.
    text.erase(0, std::string_view("assistant").size());
  }
  size_t pos = text.find(kChannelText);
  if (pos != std::string::npos) {
    ChannelCut cut = cut_channel(text);
    salvaged.channel = normalize_channel(cut.channel_word);
    // Keep the text as written around the channel marker, minus the marker and its word.
    size_t word_end = pos + kChannelText.size() + cut.channel_word.size();
    text.erase(pos, word_end - pos);
  }
  for (std::string_view spelled : {kChannelText, kConstrainText}) replace_all(text, spelled, "");
  size_t first = 0;
  while (first < text.size() && is_ascii_space(text[first])) ++first;
  salvaged.text = text.substr(first);
  return salvaged;
}

}  // namespace ossrt::harmony
