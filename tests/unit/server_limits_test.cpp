// The server's defences against hostile input (issue 19), piece by piece, each against a value
// computed independently of the code under test: nesting depth against a recursive count of the
// parsed value, token-limited encoding against plain encoding, the store's eviction against the
// order entries were made, ids against their specified shape.
#include <gtest/gtest.h>

#include <boost/beast/http/message.hpp>

#include <cfloat>
#include <latch>
#include <random>
#include <set>
#include <thread>

#include "harmony/chat_request.h"
#include "harmony/renderer.h"
#include "harmony/typescript_schema.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/http_server.h"
#include "server/random_id.h"
#include "server/request_fields.h"
#include "server/response_store.h"
#include "server/work_pool.h"
#include "tokenizer/tokenizer.h"

namespace ossrt::server {
namespace {

namespace http = boost::beast::http;

size_t depth_of(const Json& v) {
  if (!v.is_structured()) return 0;
  size_t deepest = 0;
  for (const auto& child : v) deepest = std::max(deepest, depth_of(child));
  return 1 + deepest;
}

// A random JSON value, nested up to `max_depth`, with brackets and escapes inside its strings.
Json random_json(std::mt19937& rng, int max_depth) {
  int kind = max_depth <= 0 ? int(rng() % 3) : int(rng() % 5);
  switch (kind) {
    case 0: return int(rng() % 100);
    case 1: return std::string(rng() % 2 ? "[{\"]}\\" : "plain");
    case 2: return nullptr;
    case 3: {
      Json a = Json::array();
      for (int i = int(rng() % 3); i >= 0; --i) a.push_back(random_json(rng, max_depth - 1));
      return a;
    }
    default: {
      Json o = Json::object();
      for (int i = int(rng() % 3); i >= 0; --i) o["k" + std::to_string(i) + "{"] = random_json(rng, max_depth - 1);
      return o;
    }
  }
}

int status_of(const std::function<void()>& fn, std::string* param = nullptr) {
  try {
    fn();
  } catch (const ApiError& e) {
    if (param) *param = e.param();
    return e.status();
  }
  return 200;
}

TEST(JsonDepth, PrescanAgreesWithTheParsedValue) {
  std::mt19937 rng(19);
  for (int i = 0; i < 500; ++i) {
    Json v = random_json(rng, 1 + int(rng() % 8));
    const std::string text = v.dump();
    const size_t depth = depth_of(v);
    for (size_t limit = 0; limit <= 9; ++limit)
      EXPECT_EQ(json_nesting_exceeds(text, limit), depth > limit) << text << " limit " << limit;
  }
}

TEST(JsonDepth, ParseRefusesTooDeepBodiesBeforeParsing) {
  auto body = [](int depth) { return "{\"a\":" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}"; };
  EXPECT_EQ(status_of([&] { parse_json_body(body(64)); }), 200);
  EXPECT_EQ(status_of([&] { parse_json_body(body(65)); }), 400);
  // 100,000 levels: refused by the scan (a recursive copy of it overflowed the stack).
  EXPECT_EQ(status_of([&] { parse_json_body(body(100000)); }), 400);
  EXPECT_EQ(status_of([&] { parse_json_body("[1]"); }), 400);  // not an object
  EXPECT_EQ(status_of([&] { parse_json_body("{\"a\":"); }), 400);
}

TEST(RequestFields, IntegersAreRangeCheckedBeforeNarrowing) {
  Json body = Json::parse(R"({"a": 2147483648, "b": 18446744073709551615, "c": 5.0, "d": 5.5, "e": -1, "f": 1e300})");
  std::string param;
  EXPECT_EQ(status_of([&] { int_field(body, "a", 0, INT32_MAX); }, &param), 400);
  EXPECT_EQ(param, "a");
  EXPECT_EQ(status_of([&] { int_field(body, "b"); }), 400);  // beyond int64: never wrapped to -1
  EXPECT_EQ(int_field(body, "c"), 5);
  EXPECT_EQ(status_of([&] { int_field(body, "d"); }), 400);
  EXPECT_EQ(status_of([&] { int_field(body, "e", 0); }), 400);
  EXPECT_EQ(status_of([&] { int_field(body, "f"); }), 400);
  EXPECT_EQ(int_field(body, "missing"), std::nullopt);
}

TEST(RequestFields, SamplingValuesOutsideTheEngineAre400sNamingTheField) {
  const GenerationLimits limits{201088, 4096};
  auto param_of = [&](const std::string& extra) {
    std::string param;
    int status = status_of(
        [&] {
          SamplingRequest s = parse_sampling(Json::parse("{" + extra + "}"), SamplingApi::Chat, limits);
          resolve_max_tokens(s, 100, limits.max_model_len);
        },
        &param);
    return status == 200 ? std::string("ok") : param;
  };
  EXPECT_EQ(param_of(R"("stop_token_ids": [-1])"), "stop_token_ids");
  EXPECT_EQ(param_of(R"("stop_token_ids": [201088])"), "stop_token_ids");
  EXPECT_EQ(param_of(R"("stop_token_ids": [1099511627776])"), "stop_token_ids");
  EXPECT_EQ(param_of(R"("stop_token_ids": [201087])"), "ok");
  EXPECT_EQ(param_of(R"("logit_bias": {"201088": 5})"), "logit_bias");
  EXPECT_EQ(param_of(R"("logit_bias": {"-1": 5})"), "logit_bias");
  EXPECT_EQ(param_of(R"("logit_bias": {"5": 101})"), "logit_bias");
  EXPECT_EQ(param_of(R"("min_tokens": 10, "max_tokens": 5)"), "min_tokens");
  EXPECT_EQ(param_of(R"("min_tokens": 2147483647)"), "min_tokens");
  EXPECT_EQ(param_of(R"("max_tokens": 2147483648)"), "max_tokens");
  EXPECT_EQ(param_of(R"("max_completion_tokens": 5000)"), "max_completion_tokens");
  EXPECT_EQ(param_of(R"("top_k": 18446744073709551616)"), "top_k");
  EXPECT_EQ(param_of(R"("n": 17)"), "n");

  SamplingRequest s =
      parse_sampling(Json::parse(R"({"top_k": 2147483648, "top_p": 1e-300})"), SamplingApi::Chat, limits);
  EXPECT_EQ(s.params.top_k, 0);        // beyond the vocabulary: every token kept
  EXPECT_EQ(s.params.top_p, FLT_MIN);  // positive, as asked
  GenerationRequest request;
  request.id = "x";
  request.prompt_ids = {1, 2};
  request.sampling = s.params;
  EXPECT_FALSE(validate_generation_request(request, limits));
}

TEST(RequestFields, ContextOverflowMessageUses64BitSums) {
  SamplingRequest s = parse_sampling(Json::parse(R"({"max_tokens": 2147483647})"), SamplingApi::Chat, {201088, 4096});
  try {
    resolve_max_tokens(s, 100, 4096);
    FAIL() << "no error";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_NE(e.message().find("you requested 2147483747 tokens (100 in the messages, 2147483647 in the completion)"),
              std::string::npos)
        << e.message();
  }
}

TEST(RequestFields, MetadataFollowsOpenAIsLimits) {
  auto status = [](const Json& metadata) { return status_of([&] { read_metadata(Json{{"metadata", metadata}}); }); };
  Json sixteen = Json::object();
  for (int i = 0; i < 16; ++i) sixteen["k" + std::to_string(i)] = "v";
  EXPECT_EQ(status(sixteen), 200);
  sixteen["k16"] = "v";
  EXPECT_EQ(status(sixteen), 400);
  // Lengths are characters: 64 two-byte characters is a valid key, 65 ASCII is not.
  std::string e_acute = "\xc3\xa9";
  std::string key64;
  for (int i = 0; i < 64; ++i) key64 += e_acute;
  EXPECT_EQ(status(Json{{key64, std::string(512, 'v')}}), 200);
  EXPECT_EQ(status(Json{{std::string(65, 'k'), "v"}}), 400);
  EXPECT_EQ(status(Json{{"k", std::string(513, 'v')}}), 400);
  EXPECT_EQ(status(Json{{"k", 5}}), 400);
  EXPECT_EQ(status(Json::array()), 400);
}

TEST(RequestFields, EchoCutsAtACharacterBoundary) {
  EXPECT_EQ(echo("short"), "short");
  std::string s(63, 'a');
  s += "\xc3\xa9tail";  // a two-byte character straddles byte 64
  EXPECT_EQ(echo(s), std::string(63, 'a') + "...");
  EXPECT_EQ(echo(std::string(1 << 20, 'm')).size(), 64u + 3u);
}

TEST(ResponseStore, EntriesBelongToTheirOwner) {
  ResponseStore store({16, 1 << 20, std::chrono::seconds(60)});
  ASSERT_TRUE(store.put("resp_a", "key:0", {nlohmann::json{{"id", "resp_a"}}, nlohmann::ordered_json::array()}));
  EXPECT_TRUE(store.get("resp_a", "key:0"));
  EXPECT_FALSE(store.get("resp_a", "key:1"));
  EXPECT_FALSE(store.get("resp_a", ""));
}

TEST(ResponseStore, ByteBudgetEvictsOldestFirst) {
  auto entry = [](size_t bytes) {
    return StoredResponse{nlohmann::json{{"blob", std::string(bytes, 'x')}}, nlohmann::ordered_json::array()};
  };
  ResponseStore store({100, 10000, std::chrono::seconds(60)});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.put("r" + std::to_string(i), "", entry(3000)));
  // Each entry is ~3,000 bytes: only the newest three fit in 10,000.
  EXPECT_EQ(store.size(), 3u);
  EXPECT_LE(store.bytes(), 10000u);
  EXPECT_FALSE(store.get("r0", ""));
  EXPECT_FALSE(store.get("r1", ""));
  EXPECT_TRUE(store.get("r4", ""));
  EXPECT_FALSE(store.put("huge", "", entry(20000)));  // larger than the whole budget
  EXPECT_TRUE(store.get("r4", ""));
}

TEST(WorkPool, RefusesBeyondItsQueueAndRunsEverythingItAccepted) {
  std::latch release(1);
  std::atomic<int> ran{0};
  {
    WorkPool pool(1, 3);
    std::latch started(1);
    ASSERT_TRUE(pool.try_post([&] {
      started.count_down();
      release.wait();
      ++ran;
    }));
    started.wait();  // the one thread is busy; the queue is empty
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.try_post([&] { ++ran; }));
    EXPECT_FALSE(pool.try_post([&] { ++ran; }));
    EXPECT_EQ(pool.queued(), 3u);
    release.count_down();
  }  // the destructor runs what was queued
  EXPECT_EQ(ran.load(), 4);
}

TEST(Auth, KeysNamePrincipals) {
  EXPECT_EQ(authenticate({}, ""), "");
  EXPECT_EQ(authenticate({"a", "bb"}, "Bearer bb"), "key:1");
  EXPECT_EQ(authenticate({"a", "bb"}, "Bearer a"), "key:0");
  EXPECT_FALSE(authenticate({"a", "bb"}, "Bearer b"));
  EXPECT_FALSE(authenticate({"a", "bb"}, "Bearer bbb"));
  EXPECT_FALSE(authenticate({"a"}, "a"));
  EXPECT_FALSE(authenticate({"a"}, ""));
}

TEST(RandomId, Is128HexBitsAndNeverRepeats) {
  std::set<std::string> seen;
  std::array<int, 16> digit_count{};
  for (int i = 0; i < 2000; ++i) {
    std::string id = random_id("resp_");
    ASSERT_EQ(id.size(), 5u + 32u);
    ASSERT_EQ(id.rfind("resp_", 0), 0u);
    for (char c : id.substr(5)) {
      ASSERT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << id;
      ++digit_count[c <= '9' ? c - '0' : c - 'a' + 10];
    }
    EXPECT_TRUE(seen.insert(id).second);
  }
  // 64,000 digits: each of 16 values about 4,000 times (a counter or a stuck byte would not be).
  for (int n : digit_count) EXPECT_NEAR(n, 4000, 400);
}

TEST(TransferEncoding, OnlyAFinalChunkedIsFramed) {
  auto problem = [](std::vector<std::pair<std::string, std::string>> headers) {
    HttpRequest req(http::verb::post, "/v1/completions", 11);
    for (auto& [k, v] : headers) req.insert(k, v);
    auto p = transfer_encoding_problem(req);
    return p ? p->first : 0;
  };
  EXPECT_EQ(problem({}), 0);
  EXPECT_EQ(problem({{"Content-Length", "5"}}), 0);
  EXPECT_EQ(problem({{"Transfer-Encoding", "chunked"}}), 0);
  EXPECT_EQ(problem({{"Transfer-Encoding", "Chunked "}}), 0);
  EXPECT_EQ(problem({{"Transfer-Encoding", "gzip"}}), 400);
  EXPECT_EQ(problem({{"Transfer-Encoding", "chunked, gzip"}}), 400);
  EXPECT_EQ(problem({{"Transfer-Encoding", "gzip, chunked"}}), 501);
  EXPECT_EQ(problem({{"Transfer-Encoding", "gzip"}, {"Transfer-Encoding", "chunked"}}), 501);
  EXPECT_EQ(problem({{"Transfer-Encoding", "chunked"}, {"Content-Length", "3"}}), 400);
}

std::shared_ptr<const Tokenizer> tok() {
  static auto t = Tokenizer::load(default_tokenizer_path());
  return t;
}

TEST(BoundedTokenization, AgreesWithPlainEncoding) {
  const std::string text = "The quick brown fox, 世界 <|start|> jumps\n\n   over \xff the lazy dog 1234567.";
  const auto all = tok()->encode(text);
  const auto special = tok()->encode_with_special(text);
  for (size_t limit = 0; limit <= all.size() + 2; ++limit) {
    auto bounded = tok()->encode_at_most(text, limit);
    if (all.size() <= limit)
      EXPECT_EQ(bounded, all) << limit;
    else
      EXPECT_FALSE(bounded) << limit;
  }
  for (size_t limit = 0; limit <= special.size() + 2; ++limit) {
    auto bounded = tok()->encode_with_special_at_most(text, limit);
    if (special.size() <= limit)
      EXPECT_EQ(bounded, special) << limit;
    else
      EXPECT_FALSE(bounded) << limit;
  }
  // No token is longer than max_token_bytes(), so that bound never refuses what would fit.
  size_t longest = 0;
  for (int32_t id = 0; id < tok()->defined_token_count(); ++id)
    if (!tok()->is_special(id)) longest = std::max(longest, tok()->token_bytes(id).size());
  EXPECT_GE(tok()->max_token_bytes(), longest);
  // 30 MB against 1,000 tokens: refused (without being encoded).
  EXPECT_FALSE(tok()->encode_at_most(std::string(30 << 20, 'a'), 1000));
}

TEST(BoundedRendering, RefusesAPromptOverTheLimitAndMatchesBelowIt) {
  Json body = Json::parse(R"({"messages": [{"role": "user", "content": "Hello there, how are you today?"}]})");
  auto chat = harmony::conversation_from_chat_request(body);
  auto full = harmony::render_for_completion(chat.conversation, *tok());
  auto same = harmony::render_for_completion(chat.conversation, *tok(), full.token_ids.size());
  EXPECT_EQ(same.token_ids, full.token_ids);
  EXPECT_THROW(harmony::render_for_completion(chat.conversation, *tok(), full.token_ids.size() - 1),
               harmony::PromptTooLong);
}

TEST(BoundedRendering, ToolSchemasStopAtTheBudget) {
  // A schema within any depth limit whose text is large: 3,000 nested-object properties.
  Json properties = Json::object();
  for (int i = 0; i < 3000; ++i)
    properties["p" + std::to_string(i)] = Json{{"type", "object"}, {"properties", {{"q", {{"type", "string"}}}}}};
  Json schema = {{"type", "object"}, {"properties", properties}};
  const std::string unbounded = harmony::schema_to_typescript(schema, "");
  harmony::RenderBudget budget{unbounded.size() / 2, 123};
  try {
    harmony::schema_to_typescript(schema, "", budget);
    FAIL() << "no PromptTooLong";
  } catch (const harmony::PromptTooLong& e) {
    EXPECT_EQ(e.max_tokens(), 123u);
  }
  EXPECT_EQ(harmony::schema_to_typescript(schema, "", harmony::RenderBudget{unbounded.size(), 1}), unbounded);
}

}  // namespace
}  // namespace ossrt::server
