#include "structured/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "structured/error.h"
#include "structured/json_leaves.h"
#include "structured/regex.h"

namespace ossrt::structured {

namespace {

using json = nlohmann::ordered_json;

// Keywords that only annotate: ignored.
const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {
      "title",         "description", "default",      "examples",        "example",
      "$schema",       "$id",         "$comment",     "deprecated",      "readOnly",
      "writeOnly",     "$defs",       "definitions",  "contentEncoding", "contentMediaType",
      "discriminator", "xml",         "externalDocs", "$anchor",         "strict"};
  return k;
}

// Keywords whose meaning we cannot enforce: refused, by name.
const std::set<std::string>& unsupported_keywords() {
  static const std::set<std::string> k = {"not",
                                          "if",
                                          "then",
                                          "else",
                                          "dependentRequired",
                                          "dependentSchemas",
                                          "dependencies",
                                          "patternProperties",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "contentSchema",
                                          "$dynamicRef",
                                          "$recursiveRef",
                                          "$dynamicAnchor",
                                          "$recursiveAnchor"};
  return k;
}

// Keywords understood here (anything else unknown is ignored, as JSON Schema does).
const std::set<std::string>& validation_keywords() {
  static const std::set<std::string> k = {"type",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "nullable",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "unevaluatedProperties",
                                          "propertyNames",
                                          "minProperties",
                                          "maxProperties",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "unevaluatedItems",
                                          "minItems",
                                          "maxItems",
                                          "uniqueItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "multipleOf"};
  return k;
}

std::string escape_pointer_token(const std::string& t) {
  std::string out;
  for (char c : t) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string rule_hint(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(uint8_t(c)))
      out += char(std::tolower(uint8_t(c)));
    else if (!out.empty() && out.back() != '_')
      out += '_';
    if (out.size() >= 32) break;
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "x" : out;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options) : root_(root), options_(options), rules_(g_) {}

  Grammar compile() {
    const int32_t root = g_.add_rule("root");
    g_.set_root(root);
    g_.set_body(root, node(root_, "", 0));
    // Referenced schemas are compiled here, not recursively, so $ref chains cost no stack.
    while (!pending_.empty()) {
      auto [rule, pointer] = pending_.back();
      pending_.pop_back();
      g_.set_body(rule, node(resolve(pointer, pointer), pointer, 0));
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] static void fail(const std::string& where, const std::string& msg) { throw StructuredError(where, msg); }
  static std::string at(const std::string& path, const std::string& key) {
    return path + "/" + escape_pointer_token(key);
  }

  std::string literal_of(const json& v, const std::string& where) {
    try {
      return v.dump();
    } catch (const json::exception& e) {
      fail(where, std::string("value cannot be written as JSON: ") + e.what());
    }
  }

  // ------------------------------------------------------------------------------------------
  int32_t node(const json& s, const std::string& path, int depth) {
    if (++count_ > options_.max_subschemas)
      fail(path, fmt::format("the schema has more than {} subschemas", options_.max_subschemas));
    if (depth > options_.max_depth) fail(path, fmt::format("the schema nests more than {} levels", options_.max_depth));
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema 'false' matches nothing");
      return rules_.value();
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (unsupported_keywords().count(key)) fail(at(path, key), fmt::format("keyword '{}' is not supported", key));
      if (key == "uniqueItems" && value.is_boolean() && value.get<bool>())
        fail(at(path, key), "keyword 'uniqueItems' is not supported");
    }
    if (s.contains("$ref")) {
      for (const auto& [key, value] : s.items())
        if (key != "$ref" && validation_keywords().count(key))
          fail(at(path, key), fmt::format("keyword '{}' next to '$ref' is not supported", key));
      return ref_node(s.at("$ref"), at(path, "$ref"));
    }
    if (s.contains("allOf")) return node(merge_all_of(s, path), path, depth + 1);
    if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s, path, depth);
    if (s.contains("const")) return g_.literal(literal_of(s.at("const"), at(path, "const")));
    if (s.contains("enum")) {
      const json& e = s.at("enum");
      if (!e.is_array() || e.empty()) fail(at(path, "enum"), "'enum' must be a non-empty array");
      std::vector<int32_t> alts;
      std::set<std::string> seen;
      for (size_t i = 0; i < e.size(); ++i) {
        std::string lit = literal_of(e[i], at(path, "enum"));
        if (seen.insert(lit).second) alts.push_back(g_.literal(lit));
      }
      return g_.alt(std::move(alts));
    }

    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s.at("type");
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) fail(at(path, "type"), "'type' must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        fail(at(path, "type"), "'type' must be a string or an array of strings");
      }
    } else {
      types = inferred_types(s);
    }
    if (s.contains("nullable") && s.at("nullable").is_boolean() && s.at("nullable").get<bool>() &&
        std::find(types.begin(), types.end(), "null") == types.end() && !types.empty())
      types.push_back("null");
    if (types.empty()) return rules_.value();  // no constraint on the type: any JSON value
    std::vector<int32_t> alts;
    std::set<std::string> seen;
    for (const std::string& t : types) {
      if (!seen.insert(t).second) continue;
      alts.push_back(typed(t, s, path, depth));
    }
    return g_.alt(std::move(alts));
  }

  // Without "type", the keywords present say which types they constrain; none -> any value.
  static std::vector<std::string> inferred_types(const json& s) {
    static const std::set<std::string> object_kw = {"properties",           "required",      "additionalProperties",
                                                    "propertyNames",        "minProperties", "maxProperties",
                                                    "unevaluatedProperties"};
    static const std::set<std::string> array_kw = {"items",    "prefixItems", "additionalItems",
                                                   "minItems", "maxItems",    "unevaluatedItems"};
    static const std::set<std::string> string_kw = {"minLength", "maxLength", "pattern", "format"};
    static const std::set<std::string> number_kw = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                                    "multipleOf"};
    std::vector<std::string> out;
    bool o = false, a = false, st = false, n = false;
    for (const auto& [key, value] : s.items()) {
      o = o || object_kw.count(key);
      a = a || array_kw.count(key);
      st = st || string_kw.count(key);
      n = n || number_kw.count(key);
    }
    if (o) out.push_back("object");
    if (a) out.push_back("array");
    if (st) out.push_back("string");
    if (n) out.push_back("number");
    return out;
  }

  int32_t typed(const std::string& t, const json& s, const std::string& path, int depth) {
    if (t == "null") return g_.literal("null");
    if (t == "boolean") return g_.alt({g_.literal("true"), g_.literal("false")});
    if (t == "integer" || t == "number") return number_node(t == "integer", s, path);
    if (t == "string") return string_node(s, path);
    if (t == "object") return object_node(s, path, depth);
    if (t == "array") return array_node(s, path, depth);
    fail(at(path, "type"), fmt::format("unknown type '{}'", t));
  }

  // ------------------------------------------------------------------------------------------
  std::optional<Decimal> bound(const json& s, const std::string& key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    const json& v = s.at(key);
    if (!v.is_number()) fail(at(path, key), fmt::format("'{}' must be a number", key));
    auto d = Decimal::parse(v.dump());
    if (!d) fail(at(path, key), fmt::format("'{}' is not a finite number", key));
    return d;
  }

  int32_t number_node(bool integer, const json& s, const std::string& path) {
    if (s.contains("multipleOf")) {
      const json& m = s.at("multipleOf");
      if (!(integer && m.is_number() && m.get<double>() == 1.0))
        fail(at(path, "multipleOf"), "keyword 'multipleOf' is not supported (except 1 on integers)");
    }
    NumberBounds b;
    b.minimum = bound(s, "minimum", path);
    b.maximum = bound(s, "maximum", path);
    // exclusiveMinimum: a number (draft 6+) or a boolean modifying minimum (draft 4).
    for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const json& v = s.at(key);
      const bool is_min = std::string(key) == "exclusiveMinimum";
      if (v.is_boolean()) {
        (is_min ? b.exclusive_minimum : b.exclusive_maximum) = v.get<bool>();
        continue;
      }
      auto d = bound(s, key, path);
      auto& current = is_min ? b.minimum : b.maximum;
      // Two lower bounds: keep the tighter (compare as doubles; they are JSON numbers).
      const double dv = v.get<double>();
      const bool tighter =
          !current || (is_min ? dv >= s.at("minimum").get<double>() : dv <= s.at("maximum").get<double>());
      if (tighter) {
        current = d;
        (is_min ? b.exclusive_minimum : b.exclusive_maximum) = true;
      }
    }
    if (!b.minimum && !b.maximum) return integer ? rules_.integer() : rules_.number();
    try {
      return integer ? bounded_integer(g_, b) : bounded_number(g_, b);
    } catch (const StructuredError& e) {
      fail(path, e.what());
    }
  }

  int32_t int_keyword(const json& s, const std::string& key, const std::string& path, int64_t limit) {
    const json& v = s.at(key);
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>()))))
      fail(at(path, key), fmt::format("'{}' must be a non-negative integer", key));
    const double d = v.get<double>();
    if (d < 0) fail(at(path, key), fmt::format("'{}' must be a non-negative integer", key));
    if (d > double(limit)) fail(at(path, key), fmt::format("'{}' above {} is not supported", key, limit));
    return int32_t(d);
  }

  int32_t string_node(const json& s, const std::string& path) {
    std::vector<int32_t> parts;  // content languages, intersected
    if (s.contains("pattern")) {
      const json& p = s.at("pattern");
      if (!p.is_string()) fail(at(path, "pattern"), "'pattern' must be a string");
      try {
        parts.push_back(compile_regex(g_, p.get<std::string>(), RegexOptions{CharSpelling::JsonString, true}));
      } catch (const StructuredError& e) {
        fail(at(path, "pattern"), e.what());
      }
    }
    if (s.contains("format")) {
      const json& f = s.at("format");
      if (!f.is_string()) fail(at(path, "format"), "'format' must be a string");
      try {
        parts.push_back(format_content(g_, f.get<std::string>()));
      } catch (const StructuredError& e) {
        fail(at(path, "format"), e.what());
      }
    }
    const bool has_min = s.contains("minLength"), has_max = s.contains("maxLength");
    if (has_min || has_max) {
      const int32_t lo = has_min ? int_keyword(s, "minLength", path, kMaxStringLengthBound) : 0;
      const int32_t hi = has_max ? int_keyword(s, "maxLength", path, kMaxStringLengthBound) : kUnbounded;
      if (hi != kUnbounded && hi < lo) fail(path, "maxLength is below minLength: no string satisfies both");
      parts.push_back(g_.repeat(rules_.string_char_unit(), lo, hi));
    }
    if (parts.empty()) return rules_.string();
    int32_t content = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) content = g_.intersect(content, parts[i]);
    return g_.seq({g_.byte('"'), content, g_.byte('"')});
  }

  // ------------------------------------------------------------------------------------------
  // A subschema used as a property value or array item: its own rule, so that several
  // occurrences share it (the automaton inlines it when it is small).
  int32_t value_ref(const json& s, const std::string& path, const std::string& hint, int depth) {
    if (s.is_object() && s.size() == 1 && s.contains("$ref")) return ref_node(s.at("$ref"), at(path, "$ref"));
    const int32_t rule = g_.add_rule(g_.unique_name(hint));
    g_.set_body(rule, node(s, path, depth + 1));
    return rule_ref(rule);
  }
  int32_t rule_ref(int32_t rule) { return g_.ref(rule); }

  int32_t object_node(const json& s, const std::string& path, int depth) {
    struct Prop {
      std::string name;
      int32_t rule;  // the value, a rule (see value_ref)
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s.at("required");
      if (!r.is_array()) fail(at(path, "required"), "'required' must be an array of strings");
      for (const json& x : r) {
        if (!x.is_string()) fail(at(path, "required"), "'required' must be an array of strings");
        required.insert(x.get<std::string>());
      }
    }
    std::vector<Prop> props;
    std::set<std::string> declared;
    if (s.contains("properties")) {
      const json& p = s.at("properties");
      if (!p.is_object()) fail(at(path, "properties"), "'properties' must be an object");
      for (const auto& [name, sub] : p.items()) {
        const std::string sub_path = at(at(path, "properties"), name);
        declared.insert(name);
        props.push_back({name, value_rule(sub, sub_path, "prop_" + rule_hint(name), depth), required.count(name) > 0});
      }
    }
    for (const std::string& name : required)
      if (!declared.count(name)) props.push_back({name, value_rule(json(true), path, "any", depth), true});

    const json* additional = nullptr;
    if (s.contains("additionalProperties"))
      additional = &s.at("additionalProperties");
    else if (s.contains("unevaluatedProperties"))
      additional = &s.at("unevaluatedProperties");
    const bool additional_false = additional && additional->is_boolean() && !additional->get<bool>();
    const int32_t min_props = s.contains("minProperties") ? int_keyword(s, "minProperties", path, 1 << 20) : 0;
    const int32_t max_props = s.contains("maxProperties") ? int_keyword(s, "maxProperties", path, 1 << 20) : kUnbounded;

    if (props.empty()) {
      if (additional_false) {
        if (min_props > 0) fail(at(path, "minProperties"), "no property is allowed, so minProperties cannot be met");
        return g_.literal("{}");
      }
      // A map: any keys (or propertyNames), values from additionalProperties (or anything).
      int32_t key = -1;
      if (s.contains("propertyNames")) {
        const json& pn = s.at("propertyNames");
        if (!pn.is_object() || (pn.contains("type") && pn.at("type") != "string"))
          fail(at(path, "propertyNames"), "'propertyNames' must be a string schema");
        json as_string = pn;
        as_string["type"] = "string";
        key = value_ref(as_string, at(path, "propertyNames"), "key", depth);
      }
      const int32_t value_rule_id = additional && additional->is_object()
                                        ? value_rule(*additional, at(path, "additionalProperties"), "value", depth)
                                        : -1;
      auto member = [&] {
        return g_.seq({key >= 0 ? g_.ref(g_.node(key).rule) : rules_.string(), g_.byte(':'),
                       value_rule_id >= 0 ? g_.ref(value_rule_id) : rules_.value()});
      };
      if (max_props != kUnbounded && max_props < min_props) fail(path, "maxProperties is below minProperties");
      if (max_props == 0) return g_.literal("{}");
      const int32_t more = g_.repeat(g_.seq({g_.byte(','), member()}), std::max(0, min_props - 1),
                                     max_props == kUnbounded ? kUnbounded : max_props - 1);
      const int32_t members = g_.seq({member(), more});
      return g_.seq({g_.byte('{'), min_props > 0 ? members : g_.optional(members), g_.byte('}')});
    }

    // Declared properties only, in schema order (extra properties are optional, so leaving them
    // out always validates).
    int32_t num_required = 0;
    for (const Prop& p : props) num_required += p.required;
    if (min_props > num_required)
      fail(at(path, "minProperties"), "'minProperties' above the number of required properties is not supported");
    if (max_props != kUnbounded && max_props < int32_t(props.size())) {
      if (max_props < num_required) fail(at(path, "maxProperties"), "fewer properties allowed than are required");
      fail(at(path, "maxProperties"), "'maxProperties' below the number of properties is not supported");
    }
    auto kv = [&](size_t i) {
      return g_.seq({g_.literal(literal_of(json(props[i].name), path) + ":"), g_.ref(props[i].rule)});
    };
    auto comma_kv = [&](size_t i) { return g_.seq({g_.byte(','), kv(i)}); };
    const size_t n = props.size();
    size_t k = n;  // the first required property
    for (size_t i = 0; i < n; ++i)
      if (props[i].required) {
        k = i;
        break;
      }
    if (k == n) {
      // All optional: choose the first one present; each later one may follow.
      std::vector<int32_t> firsts;
      for (size_t j = 0; j < n; ++j) {
        std::vector<int32_t> parts{kv(j)};
        for (size_t i = j + 1; i < n; ++i) parts.push_back(g_.optional(comma_kv(i)));
        firsts.push_back(g_.seq(std::move(parts)));
      }
      return g_.seq({g_.byte('{'), g_.optional(g_.alt(std::move(firsts))), g_.byte('}')});
    }
    // Optional properties before the first required one: one of them (or the required one) is
    // first; after the required one, every property is preceded by a comma.
    std::vector<int32_t> firsts;
    for (size_t j = 0; j <= k; ++j) {
      std::vector<int32_t> parts{kv(j)};
      for (size_t i = j + 1; i < k; ++i) parts.push_back(g_.optional(comma_kv(i)));
      if (j < k) parts.push_back(comma_kv(k));
      firsts.push_back(g_.seq(std::move(parts)));
    }
    std::vector<int32_t> body{g_.byte('{'), g_.alt(std::move(firsts))};
    for (size_t i = k + 1; i < n; ++i) body.push_back(props[i].required ? comma_kv(i) : g_.optional(comma_kv(i)));
    body.push_back(g_.byte('}'));
    return g_.seq(std::move(body));
  }

  // Like value_ref, but returns the rule id (callers make a fresh reference per use).
  int32_t value_rule(const json& s, const std::string& path, const std::string& hint, int depth) {
    const int32_t r = value_ref(s, path, hint, depth);
    return g_.node(r).rule;
  }

  int32_t array_node(const json& s, const std::string& path, int depth) {
    std::vector<int32_t> prefix;  // rules
    const json* rest = nullptr;   // schema of the items after the prefix; null = anything
    bool rest_forbidden = false;
    auto take_rest = [&](const char* key) {
      if (!s.contains(key)) return;
      const json& r = s.at(key);
      if (r.is_boolean() && !r.get<bool>())
        rest_forbidden = true;
      else if (!(r.is_boolean()))
        rest = &r;
    };
    if (s.contains("prefixItems")) {
      const json& p = s.at("prefixItems");
      if (!p.is_array()) fail(at(path, "prefixItems"), "'prefixItems' must be an array");
      for (size_t i = 0; i < p.size(); ++i)
        prefix.push_back(value_rule(p[i], at(at(path, "prefixItems"), std::to_string(i)), "item", depth));
      take_rest("items");
    } else if (s.contains("items") && s.at("items").is_array()) {
      const json& p = s.at("items");
      for (size_t i = 0; i < p.size(); ++i)
        prefix.push_back(value_rule(p[i], at(at(path, "items"), std::to_string(i)), "item", depth));
      take_rest("additionalItems");
    } else {
      take_rest("items");
    }
    if (!rest && !rest_forbidden && s.contains("unevaluatedItems")) take_rest("unevaluatedItems");
    const int32_t rest_rule =
        rest ? value_rule(*rest, at(path, prefix.empty() ? "items" : "additionalItems"), "item", depth) : -1;

    constexpr int64_t kMaxItemsBound = 10'000;
    const int32_t min_items = s.contains("minItems") ? int_keyword(s, "minItems", path, kMaxItemsBound) : 0;
    int32_t max_items = s.contains("maxItems") ? int_keyword(s, "maxItems", path, 1 << 30) : kUnbounded;
    const int32_t k = int32_t(prefix.size());
    if (rest_forbidden) max_items = max_items == kUnbounded ? k : std::min(max_items, k);
    if (max_items != kUnbounded && max_items < min_items)
      fail(path, "maxItems (or a closed prefixItems) is below minItems: no array satisfies both");
    if (max_items != kUnbounded && max_items > kMaxItemsBound && max_items > min_items)
      max_items = std::max<int32_t>(min_items, kMaxItemsBound);  // only shortens what may be generated
    if (max_items == 0) return g_.literal("[]");

    auto elem = [&](int32_t i) {
      if (i < k) return g_.ref(prefix[size_t(i)]);
      return rest_rule >= 0 ? g_.ref(rest_rule) : rules_.value();
    };
    // tail(i): the items from position i on, each after a comma.
    auto tail = [&](auto&& self, int32_t i) -> int32_t {
      if (max_items != kUnbounded && i >= max_items) return g_.empty();
      if (i < k) {
        const int32_t part = g_.seq({g_.byte(','), elem(i), self(self, i + 1)});
        return i < min_items ? part : g_.optional(part);
      }
      const int32_t lo = std::max(0, min_items - i);
      const int32_t hi = max_items == kUnbounded ? kUnbounded : max_items - i;
      return g_.repeat(g_.seq({g_.byte(','), elem(i)}), lo, hi);
    };
    const int32_t items = g_.seq({elem(0), tail(tail, 1)});
    return g_.seq({g_.byte('['), min_items > 0 ? items : g_.optional(items), g_.byte(']')});
  }

  // ------------------------------------------------------------------------------------------
  int32_t any_of(const json& s, const std::string& path, int depth) {
    if (s.contains("anyOf") && s.contains("oneOf")) fail(path, "'anyOf' together with 'oneOf' is not supported");
    const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
    const json& branches = s.at(key);
    if (!branches.is_array() || branches.empty())
      fail(at(path, key), fmt::format("'{}' must be a non-empty array", key));
    // Keywords beside anyOf apply to every branch: merge them in.
    json base = json::object();
    for (const auto& [k, v] : s.items())
      if (k != key && validation_keywords().count(k)) base[k] = v;
    std::vector<int32_t> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string bp = at(at(path, key), std::to_string(i));
      if (base.empty()) {
        alts.push_back(node(branches[i], bp, depth + 1));
      } else {
        json merged = base;
        merge_into(merged, deref(branches[i], bp), bp);
        alts.push_back(node(merged, bp, depth + 1));
      }
    }
    return g_.alt(std::move(alts));
  }

  // A schema with its top-level $ref resolved (for merging).
  const json& deref(const json& s, const std::string& path) {
    const json* cur = &s;
    for (int hops = 0; cur->is_object() && cur->contains("$ref"); ++hops) {
      if (hops > 32) fail(path, "'$ref' chain too long or cyclic inside allOf/anyOf");
      const json& r = cur->at("$ref");
      if (!r.is_string() || r.get<std::string>().empty() || r.get<std::string>()[0] != '#')
        fail(at(path, "$ref"), "only local references ('#...') are supported");
      cur = &resolve(pointer_of(r.get<std::string>()), at(path, "$ref"));
    }
    return *cur;
  }

  void merge_into(json& into, const json& from, const std::string& path) {
    if (from.is_boolean()) {
      if (!from.get<bool>()) fail(path, "the schema 'false' matches nothing");
      return;
    }
    if (!from.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [k, v] : from.items()) {
      if (annotation_keywords().count(k)) continue;
      if (!into.contains(k)) {
        into[k] = v;
      } else if (k == "required" && v.is_array() && into[k].is_array()) {
        for (const json& x : v)
          if (std::find(into[k].begin(), into[k].end(), x) == into[k].end()) into[k].push_back(x);
      } else if (k == "properties" && v.is_object() && into[k].is_object()) {
        for (const auto& [name, sub] : v.items()) {
          if (!into[k].contains(name))
            into[k][name] = sub;
          else if (into[k][name] != sub)
            fail(at(at(path, k), name), "property defined differently in several allOf members is not supported");
        }
      } else if (into[k] != v) {
        fail(at(path, k),
             fmt::format("keyword '{}' with different values in several allOf/anyOf parts is not supported", k));
      }
    }
  }

  json merge_all_of(const json& s, const std::string& path) {
    const json& all = s.at("allOf");
    if (!all.is_array() || all.empty()) fail(at(path, "allOf"), "'allOf' must be a non-empty array");
    json merged = json::object();
    for (const auto& [k, v] : s.items())
      if (k != "allOf") merged[k] = v;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string bp = at(at(path, "allOf"), std::to_string(i));
      const json& member = deref(all[i], bp);
      if (member.is_object() && member.contains("allOf")) {
        merge_into(merged, merge_all_of(member, bp), bp);
      } else {
        merge_into(merged, member, bp);
      }
    }
    return merged;
  }

  // ------------------------------------------------------------------------------------------
  static std::string pointer_of(const std::string& ref) {
    // "#/a/b%20c" -> "/a/b c" (URI fragment: percent-decoded)
    std::string out;
    for (size_t i = 1; i < ref.size(); ++i) {
      if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(uint8_t(ref[i + 1])) &&
          std::isxdigit(uint8_t(ref[i + 2]))) {
        out += char(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        out += ref[i];
      }
    }
    return out;
  }

  const json& resolve(const std::string& pointer, const std::string& where) {
    const json* cur = &root_;
    size_t i = 0;
    if (!pointer.empty() && pointer[0] != '/')
      fail(where, fmt::format("reference '#{}' is not a JSON pointer", pointer));
    while (i < pointer.size()) {
      const size_t next = pointer.find('/', i + 1);
      std::string token = pointer.substr(i + 1, next == std::string::npos ? std::string::npos : next - i - 1);
      std::string unescaped;
      for (size_t k = 0; k < token.size(); ++k) {
        if (token[k] == '~' && k + 1 < token.size() && (token[k + 1] == '0' || token[k + 1] == '1')) {
          unescaped += token[k + 1] == '0' ? '~' : '/';
          ++k;
        } else {
          unescaped += token[k];
        }
      }
      if (cur->is_object() && cur->contains(unescaped)) {
        cur = &cur->at(unescaped);
      } else if (cur->is_array() && !unescaped.empty() &&
                 unescaped.find_first_not_of("0123456789") == std::string::npos && unescaped.size() < 9 &&
                 std::stoul(unescaped) < cur->size()) {
        cur = &(*cur)[std::stoul(unescaped)];
      } else {
        fail(where, fmt::format("reference '#{}' does not resolve", pointer));
      }
      if (next == std::string::npos) break;
      i = next;
    }
    return *cur;
  }

  int32_t ref_node(const json& ref, const std::string& where) {
    if (!ref.is_string()) fail(where, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    if (r.empty() || r[0] != '#') fail(where, fmt::format("only local references ('#...') are supported, got '{}'", r));
    const std::string pointer = pointer_of(r);
    auto it = ref_rules_.find(pointer);
    if (it == ref_rules_.end()) {
      resolve(pointer, where);  // fail now, with the referring location
      const size_t slash = pointer.rfind('/');
      const std::string last = slash == std::string::npos ? "root" : pointer.substr(slash + 1);
      const int32_t rule = g_.add_rule(g_.unique_name("ref_" + rule_hint(last)));
      it = ref_rules_.emplace(pointer, rule).first;
      pending_.push_back({rule, pointer});
    }
    return g_.ref(it->second);
  }

  const json& root_;
  JsonSchemaOptions options_;
  Grammar g_;
  JsonRules rules_;
  std::map<std::string, int32_t> ref_rules_;
  std::vector<std::pair<int32_t, std::string>> pending_;
  int count_ = 0;
};

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return SchemaCompiler(schema, options).compile();
}

Grammar json_object_grammar() {
  Grammar g;
  JsonRules rules(g);
  const int32_t root = g.add_rule("root");
  g.set_root(root);
  g.set_body(root, rules.object());
  return g;
}

}  // namespace ossrt::structured
