#pragma once
// The independent side of the JSON Schema tests: a direct validator for the keywords the schema
// compiler supports (written from the JSON Schema text, sharing no code with the grammar path:
// std::regex for patterns and formats, arithmetic for the calendar), a random schema generator,
// and a generator of random VALID instances in the compact form the grammar produces.
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <regex>
#include <string>

namespace ossrt::structured::testing {

using ojson = nlohmann::ordered_json;

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline bool is_leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

inline bool valid_date(const std::string& s) {
  static const std::regex re("^(\\d{4})-(\\d{2})-(\\d{2})$");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return false;
  const int y = std::stoi(m[1]), mo = std::stoi(m[2]), d = std::stoi(m[3]);
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (mo < 1 || mo > 12 || d < 1) return false;
  return d <= days[mo - 1] + (mo == 2 && is_leap(y));
}

inline bool valid_time(const std::string& s) {
  static const std::regex re("^(\\d{2}):(\\d{2}):(\\d{2})(\\.\\d+)?(Z|[+-](\\d{2}):(\\d{2}))$", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(s, m, re)) return false;
  if (std::stoi(m[1]) > 23 || std::stoi(m[2]) > 59 || std::stoi(m[3]) > 59) return false;
  if (m[6].matched && (std::stoi(m[6]) > 23 || std::stoi(m[7]) > 59)) return false;
  return true;
}

inline bool valid_format(const std::string& format, const std::string& s) {
  if (format == "date") return valid_date(s);
  if (format == "time") return valid_time(s);
  if (format == "date-time") {
    const size_t t = s.find_first_of("Tt");
    return t != std::string::npos && valid_date(s.substr(0, t)) && valid_time(s.substr(t + 1));
  }
  if (format == "uuid")
    return std::regex_match(s, std::regex("^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$", std::regex::icase));
  if (format == "ipv4") {
    static const std::regex re("^(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})$");
    std::smatch m;
    if (!std::regex_match(s, m, re)) return false;
    for (int i = 1; i <= 4; ++i) {
      const std::string part = m[i];
      if (std::stoi(part) > 255 || (part.size() > 1 && part[0] == '0')) return false;
    }
    return true;
  }
  if (format == "email")
    return std::regex_match(s, std::regex("^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
                                          "([a-z0-9]([a-z0-9-]*[a-z0-9])?\\.)+[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
                                          std::regex::icase));
  return false;
}

// Validates `x` against `s` (resolving $ref against `root`).
inline bool validate(const ojson& x, const ojson& s, const ojson& root, int depth = 0) {
  if (depth > 200) return false;
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s.at("$ref");
    return validate(x, root.at(ojson::json_pointer(ref.substr(1))), root, depth + 1);
  }
  if (s.contains("const") && x != s.at("const")) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const ojson& e : s.at("enum")) found = found || e == x;
    if (!found) return false;
  }
  if (s.contains("anyOf")) {
    bool any = false;
    for (const ojson& b : s.at("anyOf")) any = any || validate(x, b, root, depth + 1);
    if (!any) return false;
  }
  if (s.contains("oneOf")) {
    int n = 0;
    for (const ojson& b : s.at("oneOf")) n += validate(x, b, root, depth + 1);
    if (n != 1) return false;
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s.at("type").is_string())
      types.push_back(s.at("type"));
    else
      for (const ojson& t : s.at("type")) types.push_back(t);
    if (s.value("nullable", false)) types.push_back("null");
    bool ok = false;
    for (const std::string& t : types) {
      if (t == "null") ok = ok || x.is_null();
      if (t == "boolean") ok = ok || x.is_boolean();
      if (t == "string") ok = ok || x.is_string();
      if (t == "object") ok = ok || x.is_object();
      if (t == "array") ok = ok || x.is_array();
      if (t == "number") ok = ok || x.is_number();
      if (t == "integer")
        ok = ok || x.is_number_integer() || (x.is_number_float() && std::floor(x.get<double>()) == x.get<double>());
    }
    if (!ok) return false;
  }
  if (x.is_number()) {
    const double v = x.get<double>();
    if (s.contains("minimum") && v < s.at("minimum").get<double>()) return false;
    if (s.contains("maximum") && v > s.at("maximum").get<double>()) return false;
    if (s.contains("exclusiveMinimum") && v <= s.at("exclusiveMinimum").get<double>()) return false;
    if (s.contains("exclusiveMaximum") && v >= s.at("exclusiveMaximum").get<double>()) return false;
  }
  if (x.is_string()) {
    const std::string v = x.get<std::string>();
    if (s.contains("minLength") && code_points(v) < s.at("minLength").get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(v) > s.at("maxLength").get<size_t>()) return false;
    if (s.contains("pattern") &&
        !std::regex_search(v, std::regex(s.at("pattern").get<std::string>(), std::regex::ECMAScript)))
      return false;
    if (s.contains("format") && !valid_format(s.at("format"), v)) return false;
  }
  if (x.is_object()) {
    if (s.contains("required"))
      for (const ojson& r : s.at("required"))
        if (!x.contains(r.get<std::string>())) return false;
    for (const auto& [k, v] : x.items()) {
      if (s.contains("properties") && s.at("properties").contains(k)) {
        if (!validate(v, s.at("properties").at(k), root, depth + 1)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(v, s.at("additionalProperties"), root, depth + 1)) return false;
      }
    }
    if (s.contains("minProperties") && x.size() < s.at("minProperties").get<size_t>()) return false;
    if (s.contains("maxProperties") && x.size() > s.at("maxProperties").get<size_t>()) return false;
  }
  if (x.is_array()) {
    size_t prefix = 0;
    if (s.contains("prefixItems")) {
      const ojson& p = s.at("prefixItems");
      prefix = p.size();
      for (size_t i = 0; i < x.size() && i < p.size(); ++i)
        if (!validate(x[i], p[i], root, depth + 1)) return false;
    }
    if (s.contains("items"))
      for (size_t i = prefix; i < x.size(); ++i)
        if (!validate(x[i], s.at("items"), root, depth + 1)) return false;
    if (s.contains("minItems") && x.size() < s.at("minItems").get<size_t>()) return false;
    if (s.contains("maxItems") && x.size() > s.at("maxItems").get<size_t>()) return false;
  }
  return true;
}

// Random schemas over the supported keywords; each one satisfiable.
class SchemaGen {
 public:
  explicit SchemaGen(uint64_t seed) : rng_(seed) {}
  int pick(int n) { return int(rng_() % uint64_t(n)); }

  ojson schema() {
    ojson s = node(0);
    if (pick(4) == 0) {  // a recursive definition
      ojson def = {
          {"type", "object"},
          {"properties",
           {{"v", leaf()}, {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}, {"maxItems", 2}}}}},
          {"required", {"v"}},
          {"additionalProperties", false}};
      ojson root = {{"type", "object"},
                    {"properties", {{"tree", {{"$ref", "#/$defs/node"}}}, {"other", s}}},
                    {"required", {"tree"}},
                    {"additionalProperties", false},
                    {"$defs", {{"node", def}}}};
      return root;
    }
    return s;
  }

  ojson leaf() {
    switch (pick(9)) {
      case 0: {
        ojson s = {{"type", "string"}};
        if (pick(2)) s["minLength"] = pick(3);
        s["maxLength"] = s.value("minLength", 0) + pick(6);
        return s;
      }
      case 1: {
        static const char* patterns[] = {"^[a-c]{2,4}$", "^x\\d+$", "ab", "^(yes|no)$", "^[A-Z][a-z]*-\\d{2}$", "\\.$"};
        ojson s = {{"type", "string"}, {"pattern", patterns[pick(6)]}};
        if (pick(3) == 0) s["maxLength"] = 8;
        return s;
      }
      case 2: {
        static const char* formats[] = {"date", "time", "date-time", "uuid", "ipv4", "email"};
        return {{"type", "string"}, {"format", formats[pick(6)]}};
      }
      case 3: {
        ojson s = {{"type", "integer"}};
        const int lo = pick(200) - 100;
        if (pick(3)) s["minimum"] = lo;
        if (pick(3)) s[pick(2) ? "maximum" : "exclusiveMaximum"] = lo + 1 + pick(5000);
        return s;
      }
      case 4: {
        ojson s = {{"type", "number"}};
        const double lo = (pick(20001) - 10000) / 100.0;
        if (pick(3)) s[pick(2) ? "minimum" : "exclusiveMinimum"] = lo;
        if (pick(3)) s["maximum"] = lo + (1 + pick(1000)) / 8.0;
        return s;
      }
      case 5: return {{"type", "boolean"}};
      case 6: {
        ojson e = ojson::array();
        for (int i = 0, n = 1 + pick(4); i < n; ++i) {
          switch (pick(4)) {
            case 0: e.push_back("v" + std::to_string(pick(100))); break;
            case 1: e.push_back(pick(1000) - 500); break;
            case 2: e.push_back(nullptr); break;
            default: e.push_back("é\"q\\" + std::to_string(i)); break;
          }
        }
        return {{"enum", e}};
      }
      case 7: return {{"const", pick(2) ? ojson("fixed") : ojson({{"k", 1}})}};
      default: return {{"type", pick(2) ? "string" : "null"}, {"nullable", pick(2) == 0}};
    }
  }

  ojson node(int depth) {
    const int k = depth >= 2 ? 0 : pick(5);
    if (k == 0 || k == 1) return leaf();
    if (k == 2) {  // object
      ojson props = ojson::object();
      ojson required = ojson::array();
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string name = std::string(1, char('a' + i)) + (pick(3) == 0 ? "_x" : "");
        props[name] = node(depth + 1);
        if (pick(2)) required.push_back(name);
      }
      ojson s = {{"type", "object"}, {"properties", props}, {"required", required}};
      if (pick(4)) s["additionalProperties"] = false;
      return s;
    }
    if (k == 3) {  // array
      ojson s = {{"type", "array"}, {"items", node(depth + 1)}};
      const int lo = pick(3);
      s["minItems"] = lo;
      s["maxItems"] = lo + pick(3);
      if (pick(4) == 0) s["prefixItems"] = ojson::array({leaf()});
      return s;
    }
    // anyOf of distinct types (disjoint, so oneOf would hold too)
    ojson a = {{"type", "integer"}, {"minimum", 0}, {"maximum", 9}};
    ojson b = {{"type", "object"},
               {"properties", {{"z", node(depth + 1)}}},
               {"required", {"z"}},
               {"additionalProperties", false}};
    return {{pick(2) ? "anyOf" : "oneOf", {a, b}}};
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace ossrt::structured::testing
