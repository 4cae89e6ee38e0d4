// JSON Schema -> grammar, checked against the independent validator (structured_json_oracle.h)
// over several hundred generated schemas:
//  - soundness: every document a random walk of the matcher completes parses and validates;
//  - completeness: random valid documents (compact, schema order) are accepted;
//  - the fast token masks equal the brute-force masks along those walks;
// plus hand-written cases for each keyword and for the refusals (keyword named, pointer given).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>

#include "structured/compiler.h"
#include "structured/error.h"
#include "structured/json_schema.h"
#include "structured_json_oracle.h"
#include "structured_test_util.h"

namespace ossrt::structured {
namespace {

using testing::ojson;

std::shared_ptr<const Vocabulary> json_vocab() {
  static auto v = testing::synthetic_vocab("{}[]\":,abcxyz0123456789.-eE \\ntruefalsnul_TZ@:", 800, 6, 17);
  return v;
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// Random valid instances as compact JSON text, in the subset the grammar generates.
class InstanceGen {
 public:
  InstanceGen(const ojson& root, uint64_t seed) : root_(root), rng_(seed) {}
  int pick(int n) { return int(rng_() % uint64_t(n)); }

  std::string gen(const ojson& s, int depth = 0) {
    if (s.contains("$ref"))
      return gen(root_.at(ojson::json_pointer(s.at("$ref").get<std::string>().substr(1))), depth + 1);
    if (s.contains("const")) return s.at("const").dump();
    if (s.contains("enum")) return s.at("enum")[size_t(pick(int(s.at("enum").size())))].dump();
    if (s.contains("anyOf")) return gen(s.at("anyOf")[size_t(pick(int(s.at("anyOf").size())))], depth + 1);
    if (s.contains("oneOf")) return gen(s.at("oneOf")[size_t(pick(int(s.at("oneOf").size())))], depth + 1);
    std::string type = s.at("type");
    if (s.value("nullable", false) && pick(3) == 0) return "null";
    if (type == "null") return "null";
    if (type == "boolean") return pick(2) ? "true" : "false";
    if (type == "integer") {
      int64_t lo = s.contains("minimum") ? s.at("minimum").get<int64_t>() : -100000;
      int64_t hi = s.contains("maximum")            ? s.at("maximum").get<int64_t>()
                   : s.contains("exclusiveMaximum") ? s.at("exclusiveMaximum").get<int64_t>() - 1
                                                    : 100000;
      return std::to_string(lo + int64_t(rng_() % uint64_t(hi - lo + 1)));
    }
    if (type == "number") {
      // thousandths within the bounds, written in fixed point
      double lo = s.contains("minimum") ? s.at("minimum").get<double>() : -1000.0;
      if (s.contains("exclusiveMinimum")) lo = s.at("exclusiveMinimum").get<double>() + 0.001;
      const double hi = s.contains("maximum") ? s.at("maximum").get<double>() : lo + 2000.0;
      const int64_t a = int64_t(std::ceil(lo * 1000 - 1e-9)), b = int64_t(std::floor(hi * 1000 + 1e-9));
      const int64_t v = a + int64_t(rng_() % uint64_t(b - a + 1));
      const int digits = pick(4);  // 0..3 fraction digits when exact
      if (digits == 0 && v % 1000 == 0) return std::to_string(v / 1000);
      std::string text = fmt::format("{}{}.{:03d}", v < 0 ? "-" : "", std::abs(v) / 1000, std::abs(v) % 1000);
      return text;
    }
    if (type == "string") return "\"" + string_content(s) + "\"";
    if (type == "object") {
      std::string out = "{";
      bool first = true;
      std::set<std::string> req;
      for (const auto& r : s.value("required", ojson::array())) req.insert(r.get<std::string>());
      for (const auto& [k, v] : s.at("properties").items()) {
        if (!req.count(k) && (depth > 4 || pick(2))) continue;
        if (!first) out += ",";
        first = false;
        out += ojson(k).dump() + ":" + gen(v, depth + 1);
      }
      return out + "}";
    }
    if (type == "array") {
      const size_t prefix = s.contains("prefixItems") ? s.at("prefixItems").size() : 0;
      size_t lo = s.value("minItems", 0), hi = s.value("maxItems", size_t(4));
      if (depth > 4) hi = lo;
      const size_t n = lo + size_t(pick(int(hi - lo + 1)));
      std::string out = "[";
      for (size_t i = 0; i < n; ++i) {
        if (i) out += ",";
        out += gen(i < prefix ? s.at("prefixItems")[i] : s.at("items"), depth + 1);
      }
      return out + "]";
    }
    ADD_FAILURE() << "instance generator: " << s.dump();
    return "null";
  }

 private:
  std::string string_content(const ojson& s) {
    if (s.contains("format")) {
      const std::string f = s.at("format");
      auto two = [&](int lo, int hi) { return fmt::format("{:02d}", lo + pick(hi - lo + 1)); };
      auto date = [&] {
        if (pick(5) == 0) return fmt::format("{:04d}-02-29", 4 * pick(500));  // leap years (incl. centuries / 400)
        return fmt::format("{:04d}-{}-{}", pick(10000), two(1, 12), two(1, 28));
      };
      auto time = [&] {
        return two(0, 23) + ":" + two(0, 59) + ":" + two(0, 59) + (pick(2) ? "Z" : "+" + two(0, 23) + ":" + two(0, 59));
      };
      if (f == "date") {
        std::string d = date();
        while (!testing::valid_date(d)) d = date();  // 4 * k may be 100 * odd: not leap
        return d;
      }
      if (f == "time") return time();
      if (f == "date-time") {
        std::string d = date();
        while (!testing::valid_date(d)) d = date();
        return d + "T" + time();
      }
      if (f == "uuid") {
        std::string u;
        for (int len : {8, 4, 4, 4, 12}) {
          if (!u.empty()) u += "-";
          for (int i = 0; i < len; ++i) u += "0123456789abcdef"[pick(16)];
        }
        return u;
      }
      if (f == "ipv4") return fmt::format("{}.{}.{}.{}", pick(256), pick(256), pick(256), pick(256));
      if (f == "email") return fmt::format("user{}", pick(100)) + "@example.com";
    }
    if (s.contains("pattern")) {
      const std::string p = s.at("pattern");
      if (p == "^[a-c]{2,4}$") return std::string(size_t(2 + pick(3)), char('a' + pick(3)));
      if (p == "^x\\d+$") return fmt::format("x{}", pick(1000));
      if (p == "ab") return "zab";
      if (p == "^(yes|no)$") return pick(2) ? "yes" : "no";
      if (p == "^[A-Z][a-z]*-\\d{2}$") return "Ab-" + two_digits();
      if (p == "\\.$") return "end.";
    }
    const size_t lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 5);
    std::string out;
    static const char* units[] = {"a", "Z", "é", "\\n", "\\\"", "\\u00e9", " ", "€"};
    for (size_t i = 0, n = lo + size_t(pick(int(hi - lo + 1))); i < n; ++i) out += units[pick(8)];
    return out;
  }
  std::string two_digits() { return fmt::format("{:02d}", pick(100)); }

  const ojson& root_;
  std::mt19937_64 rng_;
};

// Walks the matcher with random allowed tokens until the document can end; returns the text, or
// nullopt when it did not finish within the step budget.
std::optional<std::string> random_document(GrammarMatcher& m, std::mt19937_64& rng, bool check_masks) {
  std::string text;
  for (int step = 0; step < 400; ++step) {
    const auto fast = testing::fast_mask(m);
    if (check_masks) {
      EXPECT_EQ(testing::mask_ids(fast), testing::mask_ids(testing::brute_force_mask(m))) << text;
    }
    const auto ids = testing::mask_ids(fast);
    if (m.can_end() && (ids.empty() || rng() % 2 == 0)) return text;
    if (ids.empty()) {
      ADD_FAILURE() << "dead end after " << text;
      return std::nullopt;
    }
    // Prefer short tokens after a while so that strings and arrays close.
    int32_t t = ids[rng() % ids.size()];
    if (step > 60)
      for (int tries = 0; tries < 8 && m.grammar().vocab().bytes(t).size() > 1; ++tries) t = ids[rng() % ids.size()];
    EXPECT_TRUE(m.accept_token(t));
    text += m.grammar().vocab().bytes(t);
  }
  return std::nullopt;
}

TEST(StructuredJsonSchema, GeneratedSchemasAreSoundAndComplete) {
  GrammarCompiler compiler(json_vocab());
  std::mt19937_64 rng(1234);
  int finished = 0, instances = 0;
  for (int i = 0; i < 400; ++i) {
    testing::SchemaGen gen(uint64_t(i) * 7919 + 1);
    const ojson schema = gen.schema();
    std::shared_ptr<const CompiledGrammar> g;
    try {
      g = compiler.json_schema(schema);
    } catch (const StructuredError& e) {
      FAIL() << schema.dump() << "\n" << e.what();
    }
    // Completeness: valid documents are accepted.
    InstanceGen inst(schema, uint64_t(i));
    for (int k = 0; k < 5; ++k) {
      const std::string doc = inst.gen(schema);
      ASSERT_TRUE(testing::validate(ojson::parse(doc), schema, schema)) << "generator bug: " << doc << "\n"
                                                                        << schema.dump();
      ASSERT_TRUE(accepts(g, doc)) << doc << "\n" << schema.dump() << "\n" << g->ebnf();
      ++instances;
    }
    // Soundness: what the matcher lets a model write parses and validates.
    for (int walk = 0; walk < 4; ++walk) {
      GrammarMatcher m(g);
      auto doc = random_document(m, rng, /*check_masks=*/i % 20 == 0 && walk == 0);
      if (!doc) continue;
      ++finished;
      ojson parsed;
      try {
        parsed = ojson::parse(*doc);
      } catch (const std::exception& e) {
        FAIL() << "not JSON: " << *doc << "\n" << schema.dump();
      }
      ASSERT_TRUE(testing::validate(parsed, schema, schema)) << *doc << "\n" << schema.dump();
    }
  }
  EXPECT_GT(finished, 800) << "most random walks should complete";
  EXPECT_EQ(instances, 2000);
}

std::shared_ptr<const CompiledGrammar> compile(const char* schema) {
  static GrammarCompiler compiler(json_vocab());
  return compiler.json_schema(ojson::parse(schema));
}

TEST(StructuredJsonSchema, Keywords) {
  auto obj =
      compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},
                         "required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(accepts(obj, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(obj, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(accepts(obj, R"({"a":-0,"b":""})"));
  EXPECT_FALSE(accepts(obj, R"({"a":1})"));          // b required
  EXPECT_FALSE(accepts(obj, R"({"b":"x","a":1})"));  // schema order
  EXPECT_FALSE(accepts(obj, R"({"b":"x","d":1})"));  // no additional properties
  EXPECT_FALSE(accepts(obj, R"({ "b":"x"})"));       // compact: no whitespace
  EXPECT_FALSE(accepts(obj, R"({"a":1,"b":"x",})"));

  auto all_optional = compile(R"({"type":"object","properties":{"p":{"const":1},"q":{"const":2},"r":{"const":3}}})");
  for (const char* ok : {"{}", R"({"q":2})", R"({"p":1,"r":3})", R"({"p":1,"q":2,"r":3})"})
    EXPECT_TRUE(accepts(all_optional, ok)) << ok;
  for (const char* bad : {R"({,"q":2})", R"({"q":2,})", R"({"r":3,"p":1})"})
    EXPECT_FALSE(accepts(all_optional, bad)) << bad;

  auto map = compile(R"({"type":"object","additionalProperties":{"type":"integer","minimum":0},"maxProperties":2})");
  EXPECT_TRUE(accepts(map, R"({"any key":1,"k2":7})"));
  EXPECT_FALSE(accepts(map, R"({"a":1,"b":2,"c":3})"));
  EXPECT_FALSE(accepts(map, R"({"a":-1})"));

  auto arr = compile(
      R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"null"},"minItems":2,"maxItems":3})");
  EXPECT_TRUE(accepts(arr, R"(["a",null])"));
  EXPECT_TRUE(accepts(arr, R"(["a",null,null])"));
  EXPECT_FALSE(accepts(arr, R"(["a"])"));
  EXPECT_FALSE(accepts(arr, R"(["a",null,null,null])"));
  EXPECT_FALSE(accepts(arr, R"([null,null])"));

  auto ints = compile(R"({"type":"integer","minimum":-15,"exclusiveMaximum":120})");
  for (int v = -30; v <= 130; ++v) EXPECT_EQ(accepts(ints, std::to_string(v)), v >= -15 && v < 120) << v;
  EXPECT_FALSE(accepts(ints, "007"));
  auto nums = compile(R"({"type":"number","minimum":0.25,"maximum":2.5})");
  EXPECT_TRUE(accepts(nums, "0.25"));
  EXPECT_TRUE(accepts(nums, "2.5"));
  EXPECT_TRUE(accepts(nums, "2.500"));
  EXPECT_TRUE(accepts(nums, "1"));
  EXPECT_FALSE(accepts(nums, "0.2499"));
  EXPECT_FALSE(accepts(nums, "2.5001"));
  EXPECT_FALSE(accepts(nums, "01.5"));
  auto exclusive = compile(R"({"type":"number","exclusiveMinimum":0})");
  EXPECT_FALSE(accepts(exclusive, "0"));
  EXPECT_FALSE(accepts(exclusive, "0.000"));
  EXPECT_TRUE(accepts(exclusive, "0.000001"));
  EXPECT_FALSE(accepts(exclusive, "-0.5"));

  auto str = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(accepts(str, R"("ab")"));
  EXPECT_TRUE(accepts(str, R"("é\n€")"));  // three characters
  EXPECT_FALSE(accepts(str, R"("a")"));
  EXPECT_FALSE(accepts(str, R"("abcd")"));
  auto both = compile(R"({"type":"string","pattern":"^[a-z]+$","maxLength":3})");
  EXPECT_TRUE(accepts(both, R"("abc")"));
  EXPECT_FALSE(accepts(both, R"("abcd")"));
  EXPECT_FALSE(accepts(both, R"("ab1")"));

  auto date = compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(accepts(date, R"("2024-02-29")"));
  EXPECT_TRUE(accepts(date, R"("2000-02-29")"));
  EXPECT_FALSE(accepts(date, R"("1900-02-29")"));
  EXPECT_FALSE(accepts(date, R"("2023-04-31")"));

  auto any_of =
      compile(R"({"anyOf":[{"type":"string","maxLength":1},{"type":"array","items":{"$ref":"#"},"maxItems":2}]})");
  EXPECT_TRUE(accepts(any_of, R"([["a"],[]])"));
  EXPECT_FALSE(accepts(any_of, R"([1])"));

  auto all_of = compile(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                                     {"properties":{"b":{"type":"boolean"}},"required":["b"]}],"additionalProperties":false})");
  EXPECT_TRUE(accepts(all_of, R"({"a":1,"b":true})"));
  EXPECT_FALSE(accepts(all_of, R"({"a":1})"));

  auto defs =
      compile(R"({"$defs":{"t":{"type":"object","properties":{"n":{"$ref":"#/$defs/t"}},"additionalProperties":false}},
                          "$ref":"#/$defs/t"})");
  EXPECT_TRUE(accepts(defs, R"({"n":{"n":{}}})"));
  auto nullable = compile(R"({"type":["string","null"]})");
  EXPECT_TRUE(accepts(nullable, "null"));
  EXPECT_TRUE(accepts(nullable, R"("s")"));
  auto anything = compile("{}");
  EXPECT_TRUE(accepts(anything, R"({"a":[1,2.5e3,"x",null,true,{}]})"));
  auto json_obj = std::make_shared<const CompiledGrammar>(json_object_grammar(), json_vocab());
  EXPECT_TRUE(accepts(json_obj, R"({"a":[1,{"b":null}]})"));
  EXPECT_FALSE(accepts(json_obj, "[1]"));
}

TEST(StructuredJsonSchema, RefusalsNameTheKeywordAndWhere) {
  struct Case {
    const char* schema;
    const char* where;
    const char* words;
  };
  const Case cases[] = {
      {R"({"type":"object","properties":{"a":{"not":{"type":"null"}}}})", "/properties/a/not", "'not'"},
      {R"({"type":"array","uniqueItems":true})", "/uniqueItems", "'uniqueItems'"},
      {R"({"if":{},"then":{}})", "/if", "'if'"},
      {R"({"type":"number","multipleOf":0.5})", "/multipleOf", "'multipleOf'"},
      {R"J({"type":"string","pattern":"(?=x)"})J", "/pattern", "position 0"},
      {R"({"type":"string","format":"credit-card"})", "/format", "'credit-card'"},
      {R"({"$ref":"#/$defs/missing"})", "/$ref", "does not resolve"},
      {R"({"$ref":"https://example.com/s.json"})", "/$ref", "local references"},
      {R"({"type":"integer","minimum":5,"maximum":3})", "", "no integer"},
      {R"({"type":"string","minLength":4,"maxLength":2})", "", "maxLength"},
      {R"({"type":"wat"})", "/type", "unknown type"},
      {R"({"enum":[]})", "/enum", "non-empty"},
      {R"(false)", "", "matches nothing"},
      {R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})", "", "left recursion"},
      {R"({"type":"object","properties":{"a":{"$ref":"#/properties/a"}},"required":["a"]})", "", "matches nothing"},
      {R"({"type":"array","items":{"type":"string"},"minItems":3,"maxItems":1})", "", "minItems"},
  };
  GrammarCompiler compiler(json_vocab());
  for (const Case& c : cases) {
    try {
      compiler.json_schema(ojson::parse(c.schema));
      ADD_FAILURE() << "accepted " << c.schema;
    } catch (const StructuredError& e) {
      EXPECT_EQ(e.where(), c.where) << c.schema << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << c.schema << ": " << e.what();
    }
  }
}

TEST(StructuredJsonSchema, HostileSchemasFailFastWithoutCrashing) {
  GrammarCompiler compiler(json_vocab());
  // Deep nesting.
  ojson deep = {{"type", "string"}};
  for (int i = 0; i < 500; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_THROW(compiler.json_schema(deep), StructuredError);
  // Huge repetition bounds.
  EXPECT_THROW(compiler.json_schema(ojson::parse(R"({"type":"string","maxLength":1000000})")), StructuredError);
  ojson wide = {{"type", "array"},
                {"items", {{"type", "object"}, {"properties", ojson::object()}}},
                {"minItems", 9000},
                {"maxItems", 9000}};
  for (int i = 0; i < 40; ++i)
    wide["items"]["properties"][fmt::format("p{}", i)] = {{"type", "string"}, {"maxLength", 40}};
  wide["items"]["required"] = ojson::array();
  for (int i = 0; i < 40; ++i) wide["items"]["required"].push_back(fmt::format("p{}", i));
  EXPECT_NO_THROW(compiler.json_schema(wide));  // the item is one shared rule: 9000 calls, not copies
  EXPECT_THROW(compiler.json_schema(ojson::parse(R"({"type":"string","pattern":"^(a{2000}){2000}$"})")),
               StructuredError);
  // Many subschemas through $ref fan-out: each definition compiled once.
  ojson defs = ojson::object();
  for (int i = 0; i < 200; ++i)
    defs[fmt::format("d{}", i)] = {
        {"anyOf", {{{"$ref", "#/$defs/d" + std::to_string((i + 1) % 200)}}, {{"type", "null"}}}}};
  ojson fan = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  EXPECT_THROW(compiler.json_schema(fan), StructuredError);  // a $ref cycle without input: left recursion
  // Non-schema values in keyword positions.
  for (const char* bad : {R"({"type":"object","properties":[]})", R"({"type":"object","required":"a"})",
                          R"({"type":"string","minLength":-1})", R"({"type":"string","maxLength":1.5})",
                          R"({"anyOf":{}})", R"({"items":3,"type":"array"})", R"(42)", R"({"$ref":7})"})
    EXPECT_THROW(compiler.json_schema(ojson::parse(bad)), StructuredError) << bad;
}

}  // namespace
}  // namespace ossrt::structured
