#include "structured/json_leaves.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "structured/charset.h"
#include "structured/error.h"
#include "structured/regex.h"

namespace ossrt::structured {

namespace {

int32_t digit(Grammar& g) { return g.byte_range('0', '9'); }

int32_t compile_full(Grammar& g, std::string_view re) {
  return compile_regex(g, re, RegexOptions{CharSpelling::JsonString, false});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Generic JSON rules

int32_t JsonRules::ensure(int32_t& rule, const char* name, bool shared) {
  if (rule < 0) rule = g_.add_rule(g_.unique_name(name), !shared);
  return rule;
}

int32_t JsonRules::string_char_unit() {
  CodepointSet plain = CodepointSet::all().minus(CodepointSet::range(0, 0x1F));
  plain = plain.minus(CodepointSet::of('"')).minus(CodepointSet::of('\\'));
  const int32_t hex = g_.bytes(byte_set_of("0123456789abcdefABCDEF"));
  // \uXXXX except D800-DFFF: a lone surrogate half is not one character.
  const int32_t non_surrogate = g_.alt({
      g_.seq({g_.bytes(byte_set_of("0123456789abcABC")), hex, hex, hex}),
      g_.seq({g_.bytes(byte_set_of("dD")), g_.byte_range('0', '7'), hex, hex}),
      g_.seq({g_.bytes(byte_set_of("efEF")), hex, hex, hex}),
  });
  return g_.alt(
      {utf8_node(g_, plain),
       g_.seq({g_.byte('\\'), g_.alt({g_.bytes(byte_set_of("\"\\/bfnrt")), g_.seq({g_.byte('u'), non_surrogate})})})});
}

int32_t JsonRules::string() {
  if (string_ >= 0) return g_.ref(string_);
  ensure(string_, "json_string", true);
  CodepointSet plain = CodepointSet::all().minus(CodepointSet::range(0, 0x1F));
  plain = plain.minus(CodepointSet::of('"')).minus(CodepointSet::of('\\'));
  const ByteSet hex = byte_set_of("0123456789abcdefABCDEF");
  const int32_t escape = g_.seq(
      {g_.byte('\\'), g_.alt({g_.bytes(byte_set_of("\"\\/bfnrt")),
                              g_.seq({g_.byte('u'), g_.bytes(hex), g_.bytes(hex), g_.bytes(hex), g_.bytes(hex)})})});
  g_.set_body(string_, g_.seq({g_.byte('"'), g_.star(g_.alt({utf8_node(g_, plain), escape})), g_.byte('"')}));
  return g_.ref(string_);
}

int32_t JsonRules::integer() {
  if (integer_ >= 0) return g_.ref(integer_);
  ensure(integer_, "json_integer", true);
  g_.set_body(integer_, g_.seq({g_.optional(g_.byte('-')),
                                g_.alt({g_.byte('0'), g_.seq({g_.byte_range('1', '9'),
                                                              g_.repeat(digit(g_), 0, kMaxIntegerDigits - 1)})})}));
  return g_.ref(integer_);
}

int32_t JsonRules::number() {
  if (number_ >= 0) return g_.ref(number_);
  ensure(number_, "json_number", true);
  const int32_t int_part =
      g_.alt({g_.byte('0'), g_.seq({g_.byte_range('1', '9'), g_.repeat(digit(g_), 0, kMaxIntegerDigits - 1)})});
  const int32_t frac = g_.optional(g_.seq({g_.byte('.'), g_.repeat(digit(g_), 1, kMaxIntegerDigits)}));
  // Two exponent digits at most: 1e999 parses to Infinity, which no validator calls a number.
  const int32_t exp = g_.optional(
      g_.seq({g_.bytes(byte_set_of("eE")), g_.optional(g_.bytes(byte_set_of("+-"))), g_.repeat(digit(g_), 1, 2)}));
  g_.set_body(number_, g_.seq({g_.optional(g_.byte('-')), int_part, frac, exp}));
  return g_.ref(number_);
}

int32_t JsonRules::value() {
  if (value_ >= 0) return g_.ref(value_);
  ensure(value_, "json_value", false);
  const int32_t body =
      g_.alt({object(), array(), string(), number(), g_.literal("true"), g_.literal("false"), g_.literal("null")});
  g_.set_body(value_, body);
  return g_.ref(value_);
}

int32_t JsonRules::object() {
  if (object_ >= 0) return g_.ref(object_);
  ensure(object_, "json_object", false);
  auto member = [&] { return g_.seq({string(), g_.byte(':'), value()}); };
  g_.set_body(object_, g_.seq({g_.byte('{'), g_.optional(g_.seq({member(), g_.star(g_.seq({g_.byte(','), member()}))})),
                               g_.byte('}')}));
  return g_.ref(object_);
}

int32_t JsonRules::array() {
  if (array_ >= 0) return g_.ref(array_);
  ensure(array_, "json_array", false);
  g_.set_body(array_, g_.seq({g_.byte('['), g_.optional(g_.seq({value(), g_.star(g_.seq({g_.byte(','), value()}))})),
                              g_.byte(']')}));
  return g_.ref(array_);
}

// ---------------------------------------------------------------------------------------------
// Numbers with bounds

std::optional<Decimal> Decimal::parse(std::string_view s) {
  Decimal d;
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) d.negative = s[i++] == '-';
  std::string digits;
  int32_t exponent = 0;
  bool any = false;
  while (i < s.size() && std::isdigit(uint8_t(s[i]))) digits += s[i++], any = true;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(uint8_t(s[i]))) digits += s[i++], --exponent, any = true;
  }
  if (!any) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    int64_t e = 0;
    if (i >= s.size()) return std::nullopt;
    while (i < s.size() && std::isdigit(uint8_t(s[i]))) e = std::min<int64_t>(e * 10 + (s[i++] - '0'), 100000);
    exponent += int32_t(neg ? -e : e);
  }
  if (i != s.size()) return std::nullopt;
  const size_t nz = digits.find_first_not_of('0');
  d.digits = nz == std::string::npos ? "" : digits.substr(nz);
  while (!d.digits.empty() && d.digits.back() == '0') d.digits.pop_back(), ++exponent;
  d.exponent = d.digits.empty() ? 0 : exponent;
  if (d.digits.empty()) d.negative = false;
  return d;
}

namespace {

int64_t pow10(int n) {
  int64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

// floor or ceil of d * 10^shift, clamped to [-cap, cap].
int64_t scaled(const Decimal& d, int shift, bool ceil, int64_t cap) {
  if (d.digits.empty()) return 0;
  const int64_t len = int64_t(d.digits.size()) + d.exponent + shift;  // digits before the point
  if (len > 18) return d.negative ? -cap : cap;
  int64_t magnitude = 0;
  bool remainder = false;
  for (int64_t i = 0; i < int64_t(d.digits.size()); ++i) {
    if (i < len)
      magnitude = magnitude * 10 + (d.digits[size_t(i)] - '0');
    else
      remainder = remainder || d.digits[size_t(i)] != '0';
  }
  for (int64_t i = int64_t(d.digits.size()); i < len; ++i) magnitude *= 10;
  if (magnitude > cap) return d.negative ? -cap : cap;
  int64_t v = d.negative ? -magnitude : magnitude;
  if (remainder) {
    if (ceil && !d.negative) v += 1;
    if (!ceil && d.negative) v -= 1;
  }
  return std::clamp(v, -cap, cap);
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

class DigitRanges {
 public:
  DigitRanges(Grammar& g, int frac) : g_(g), frac_(frac) {}

  // Non-negative M in [lo, hi], written with frac_ fraction digits (the point inserted before the
  // last frac_ digits), the integer part without leading zeros.
  void add(int64_t lo, int64_t hi, std::vector<int32_t>& out) {
    if (lo > hi) return;
    const int min_len = frac_ + 1;
    for (int len = min_len; len <= 19; ++len) {
      const int64_t band_lo = len == min_len ? 0 : pow10(len - 1);
      const int64_t band_hi = len >= 19 ? INT64_MAX : pow10(len) - 1;
      const int64_t x = std::max(lo, band_lo), y = std::min(hi, band_hi);
      if (x > y) {
        if (band_lo > hi) break;
        continue;
      }
      len_ = len;
      out.push_back(range(pad(x, len), pad(y, len), 0));
    }
  }

 private:
  static std::string pad(int64_t v, int len) {
    std::string s = std::to_string(v);
    return std::string(size_t(len) - s.size(), '0') + s;
  }
  // The digit at position pos of the full string, with the point before it when due.
  int32_t at(int pos, int32_t digit_node) {
    if (frac_ > 0 && pos == len_ - frac_) return g_.seq({g_.byte('.'), digit_node});
    return digit_node;
  }
  int32_t any_digits(int from) {
    std::vector<int32_t> parts;
    for (int p = from; p < len_; ++p) parts.push_back(at(p, g_.byte_range('0', '9')));
    return g_.seq(std::move(parts));
  }
  int32_t range(const std::string& x, const std::string& y, int pos) {
    if (pos == len_) return g_.empty();
    const char a = x[size_t(pos)], b = y[size_t(pos)];
    if (a == b) return g_.seq({at(pos, g_.byte(uint8_t(a))), range(x, y, pos + 1)});
    const bool x_rest_min = x.find_first_not_of('0', size_t(pos) + 1) == std::string::npos;
    const bool y_rest_max = y.find_first_not_of('9', size_t(pos) + 1) == std::string::npos;
    std::vector<int32_t> alts;
    const char mid_lo = x_rest_min ? a : char(a + 1), mid_hi = y_rest_max ? b : char(b - 1);
    if (!x_rest_min)
      alts.push_back(g_.seq({at(pos, g_.byte(uint8_t(a))), range(x, std::string(x.size(), '9'), pos + 1)}));
    if (mid_lo <= mid_hi)
      alts.push_back(g_.seq({at(pos, g_.byte_range(uint8_t(mid_lo), uint8_t(mid_hi))), any_digits(pos + 1)}));
    if (!y_rest_max)
      alts.push_back(g_.seq({at(pos, g_.byte(uint8_t(b))), range(std::string(y.size(), '0'), y, pos + 1)}));
    return g_.alt(std::move(alts));
  }

  Grammar& g_;
  int frac_;
  int len_ = 0;
};

// Values N / 10^scale_digits with N in [n_lo, n_hi], written with 0..scale_digits fraction digits.
int32_t scaled_range(Grammar& g, int64_t n_lo, int64_t n_hi, int scale_digits) {
  std::vector<int32_t> alts;
  for (int f = 0; f <= scale_digits; ++f) {
    const int64_t unit = pow10(scale_digits - f);
    const int64_t m_lo = ceil_div(n_lo, unit), m_hi = floor_div(n_hi, unit);
    if (m_lo > m_hi) continue;
    DigitRanges digits(g, f);
    std::vector<int32_t> pos;
    digits.add(std::max<int64_t>(m_lo, 0), m_hi, pos);
    alts.insert(alts.end(), pos.begin(), pos.end());
    if (m_lo < 0) {
      std::vector<int32_t> neg;
      digits.add(std::max<int64_t>(1, -m_hi), -m_lo, neg);
      if (!neg.empty()) alts.push_back(g.seq({g.byte('-'), g.alt(std::move(neg))}));
    }
  }
  if (alts.empty()) throw StructuredError("", "no number satisfies minimum/maximum");
  return g.alt(std::move(alts));
}

int32_t bounded(Grammar& g, const NumberBounds& b, int int_digits, int frac_digits) {
  const int64_t cap = pow10(int_digits + frac_digits) - 1;
  int64_t lo = -cap, hi = cap;
  if (b.minimum)
    lo = b.exclusive_minimum ? scaled(*b.minimum, frac_digits, false, cap) + 1
                             : scaled(*b.minimum, frac_digits, true, cap);
  if (b.maximum)
    hi = b.exclusive_maximum ? scaled(*b.maximum, frac_digits, true, cap) - 1
                             : scaled(*b.maximum, frac_digits, false, cap);
  lo = std::max(lo, -cap);
  hi = std::min(hi, cap);
  if (lo > hi)
    throw StructuredError("", fmt::format("no {} satisfies minimum/maximum", frac_digits ? "number" : "integer"));
  return scaled_range(g, lo, hi, frac_digits);
}

}  // namespace

int32_t bounded_integer(Grammar& g, const NumberBounds& b) { return bounded(g, b, kMaxIntegerDigits - 1, 0); }

int32_t bounded_number(Grammar& g, const NumberBounds& b) {
  return bounded(g, b, kMaxBoundedIntDigits, kMaxFractionDigits);
}

// ---------------------------------------------------------------------------------------------
// Formats

namespace {

const std::map<std::string_view, std::string_view>& format_regexes() {
  static const std::map<std::string_view, std::string_view> table = [] {
    std::map<std::string_view, std::string_view> t;
    // Day ranges per month; February 29 only in leap years (ajv-formats checks the calendar).
    t["date"] =
        "(\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])|\\d{4}-(0[13-9]|1[0-2])-(29|30)|\\d{4}-(0[13578]|1[02])-31|"
        "(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)";
    // Always with a zone: ajv-formats 3 requires one for `time`.
    t["time"] = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,6})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    t["email"] =
        "[a-zA-Z0-9_+-]+(\\.[a-zA-Z0-9_+-]+)*@([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?\\.)+"
        "[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?";
    t["uuid"] = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
    t["ipv4"] = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}";
    t["ipv6"] = "[0-9a-fA-F]{1,4}(:[0-9a-fA-F]{1,4}){7}";
    // At most three labels of 63 characters: within the 253-character limit.
    t["hostname"] = "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?){0,2}";
    t["uri"] =
        "[a-zA-Z][a-zA-Z0-9+.-]*://[a-zA-Z0-9-]+(\\.[a-zA-Z0-9-]+)*(:\\d{1,5})?(/[a-zA-Z0-9._~!$&'()*+,;=:@-]*)*"
        "(\\?[a-zA-Z0-9._~!$&'()*+,;=:@/?-]*)?";
    t["duration"] =
        "P(\\d{1,4}Y(\\d{1,4}M)?(\\d{1,4}D)?|\\d{1,4}M(\\d{1,4}D)?|\\d{1,4}D)(T\\d{1,4}H(\\d{1,4}M)?(\\d{1,4}S)?)?"
        "|P\\d{1,4}W";
    return t;
  }();
  return table;
}

}  // namespace

bool is_supported_format(std::string_view format) {
  return format == "date-time" || format_regexes().count(format) > 0;
}

int32_t format_content(Grammar& g, std::string_view format) {
  if (format == "date-time")
    return g.seq(
        {compile_full(g, format_regexes().at("date")), g.byte('T'), compile_full(g, format_regexes().at("time"))});
  auto it = format_regexes().find(format);
  if (it == format_regexes().end()) {
    std::string names = "date-time";
    for (const auto& [k, v] : format_regexes()) names += ", " + std::string(k);
    throw StructuredError("", fmt::format("format '{}' is not supported (supported: {})", format, names));
  }
  return compile_full(g, it->second);
}

}  // namespace ossrt::structured
