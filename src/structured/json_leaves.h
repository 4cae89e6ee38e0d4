#pragma once
// Grammar pieces for JSON leaves, shared by the JSON Schema compiler: the generic JSON value
// rules, strings (with length bounds, patterns and formats), and numbers with bounds.
//
// Every piece generates a SUBSET of the valid values, chosen so that everything it produces
// validates (what a constrained model writes must pass the client's validator) while still
// covering what models write in practice:
//   - compact JSON: no whitespace anywhere;
//   - numbers: at most kMaxIntegerDigits integer digits; bounded numbers have at most
//     kMaxFractionDigits fraction digits and no exponent (so bounds are checked exactly, in
//     decimal, and ~15 significant digits survive a validator's parse into a double);
//   - strings from a pattern or format use the canonical escapes only;
//   - formats are the strict common forms (time and date-time with a zone offset, full IPv6).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "structured/grammar.h"

namespace ossrt::structured {

inline constexpr int kMaxIntegerDigits = 16;     // unbounded integers and numbers
inline constexpr int kMaxBoundedIntDigits = 12;  // numbers with a bound: |x| < 10^12
inline constexpr int kMaxFractionDigits = 6;     // numbers with a bound
inline constexpr int32_t kMaxStringLengthBound = 10'000;

// Shared rules of a schema grammar, created on first use (rules stay calls: many uses share
// one set of precomputed masks).
class JsonRules {
 public:
  explicit JsonRules(Grammar& g) : g_(g) {}
  int32_t value();    // any JSON value
  int32_t object();   // any JSON object
  int32_t array();    // any JSON array
  int32_t string();   // any JSON string, every escape allowed
  int32_t number();   // any JSON number (digit limits above, exponent of at most 2 digits)
  int32_t integer();  // any integer

  // One character of string content (raw UTF-8 except '"', '\' and controls, or an escape other
  // than a surrogate \u, so each unit is exactly one character for minLength / maxLength).
  int32_t string_char_unit();

 private:
  int32_t ensure(int32_t& rule, const char* name, bool shared);
  Grammar& g_;
  int32_t value_ = -1, object_ = -1, array_ = -1, string_ = -1, number_ = -1, integer_ = -1;
};

// A decimal bound parsed exactly from its JSON text ("1e-3", "-12.5", "7").
struct Decimal {
  bool negative = false;
  std::string digits;    // no leading zeros ("" = 0)
  int32_t exponent = 0;  // value = digits * 10^exponent
  static std::optional<Decimal> parse(std::string_view json_number_text);
};

struct NumberBounds {
  std::optional<Decimal> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;
};

// Integers / numbers within the bounds (at least one bound set). Throws StructuredError when no
// value of the generated subset satisfies them.
int32_t bounded_integer(Grammar& g, const NumberBounds& bounds);
int32_t bounded_number(Grammar& g, const NumberBounds& bounds);

// The content (between the quotes) of a string in `format`; throws for an unknown format.
int32_t format_content(Grammar& g, std::string_view format);
bool is_supported_format(std::string_view format);

}  // namespace ossrt::structured
