#pragma once
// One function per parser that sees untrusted bytes (issue 19). Each is what a libFuzzer binary
// calls per input (fuzz_main.cpp, built with clang under -DOSSRT_FUZZ=ON) and what
// fuzz_regression_test replays over every committed input in tests/fuzz/corpus/<target>/ (built
// everywhere, so a crash once found stays fixed). A function returns normally for every input;
// a bug is a crash, a sanitizer report, or an abort() from a violated property below.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ossrt::fuzz {

// A property of a target does not hold: prints it and aborts (libFuzzer saves the input).
[[noreturn]] void violated(const std::string& what);

// An HTTP request (method, target, headers, body) through Beast's parser, then the server's own
// head checks (framing, route, method, key).
void http_request(const uint8_t* data, size_t size);
// A JSON body for each generation endpoint (first byte picks chat / completions / responses /
// tokenize), through the handler up to the generator and back through the output path. Only
// ApiError (a 4xx/429/503 answer) may come out; anything else would have been a 500.
void request_json(const uint8_t* data, size_t size);
// Token ids (2 bytes each) through the streaming Harmony parser and the chat output mapper, fed
// in chunks whose sizes come from the input; streaming must equal batch parsing.
void harmony_parser(const uint8_t* data, size_t size);
// Text through encode / encode_with_special / encode_at_most (must agree with encode) / decode
// (must round-trip valid UTF-8) / the incremental decoder (must equal decode).
void tokenizer(const uint8_t* data, size_t size);
// A safetensors file: header length, JSON header, data section; only ossrt::Error may come out.
void safetensors_header(const uint8_t* data, size_t size);
// A config.json; only ossrt::Error may come out.
void config_json(const uint8_t* data, size_t size);
// A structured-output source (byte 0: JSON Schema / regex / EBNF / choice list; byte 1: a seed)
// through the grammar compiler and a matcher walk (fuzz_structured.cpp): only StructuredError may
// come out, and the fast token masks must equal the brute-force ones.
void structured_source(const uint8_t* data, size_t size);

struct Target {
  const char* name;
  void (*run)(const uint8_t*, size_t);
};
const std::vector<Target>& targets();

}  // namespace ossrt::fuzz
