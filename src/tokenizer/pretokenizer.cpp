#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace ossrt::tokenizer_detail {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

// Match data and a JIT stack per thread: pcre2_match_data is written by every match, so sharing
// one across threads would race, and allocating one per call would cost more than a short match.
// The JIT stack grows to 8 MiB so that pathological inputs (100k-character runs) cannot overflow.
struct ThreadMatchState {
  pcre2_match_data* match_data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (!match_data || !context || !jit_stack) fail("tokenizer: out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Compiled() { pcre2_code_free(code); }
};

std::string rewrite_whitespace_classes(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char escaped = pattern[++i];
    if (escaped == 's') {
      out += "\\p{White_Space}";
    } else if (escaped == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(escaped);  // copies `\\` as a pair, so `\\s` stays a backslash and an 's'
    }
  }
  return out;
}

PreTokenizer::PreTokenizer(const std::string& pattern)
    : compiled_(std::make_unique<Compiled>()), compiled_pattern_(rewrite_whitespace_classes(pattern)) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled_pattern_.data()), compiled_pattern_.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (!compiled_->code) {
    fail("tokenizer: pre-tokenizer regex does not compile at offset {}: {} (pattern after \\s rewrite: {})",
         error_offset, pcre2_message(error_code), compiled_pattern_);
  }
  // Without JIT (a PCRE2 built without it) the interpreter gives the same pieces, only slower.
  compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  ThreadMatchState& state = thread_match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t gap_start = 0;
  while (pos < n) {
    // The text was validated by the caller, so both paths skip PCRE2's own UTF check.
    const int rc =
        compiled_->jit
            ? pcre2_jit_match(compiled_->code, subject, n, pos, 0, state.match_data, state.context)
            : pcre2_match(compiled_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, state.match_data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer: pre-tokenizer regex failed at byte {}: {}", pos, pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end == start) {
      // An empty match (impossible with the gpt-oss pattern, possible with others): step over
      // one character and let it join the gap, so the loop always advances.
      pos = start + 1;
      while (pos < n && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > gap_start) pieces.push_back(text.substr(gap_start, start - gap_start));
    pieces.push_back(text.substr(start, end - start));
    pos = gap_start = end;
  }
  if (gap_start < n) pieces.push_back(text.substr(gap_start));
}

}  // namespace ossrt::tokenizer_detail
