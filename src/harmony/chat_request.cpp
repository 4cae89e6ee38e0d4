// OpenAI chat-completions body -> Conversation. Validation errors name the JSON path of the bad
// field, because the server turns them into HTTP 400 with `param` and a client can only fix what
// it can find.
#include "harmony/chat_request.h"

#include <fmt/format.h>

#include <chrono>
#include <map>
#include <set>

namespace ossrt::harmony {
namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void reject(const std::string& param, const std::string& message) {
  throw HarmonyRequestError(param, message);
}

std::string describe(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::object: return "an object";
    case Json::value_t::array: return "an array";
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

const Json* field(const Json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// A present, non-null field.
const Json* given(const Json& object, const char* key) {
  const Json* value = field(object, key);
  return value && !value->is_null() ? value : nullptr;
}

void expect_object(const Json& value, const std::string& param) {
  if (!value.is_object()) reject(param, "expected an object, got " + describe(value));
}

const std::string& expect_string(const Json& value, const std::string& param) {
  if (!value.is_string()) reject(param, "expected a string, got " + describe(value));
  return value.get_ref<const std::string&>();
}

// Message content: a string, null, or an array of text parts (joined by newlines). gpt-oss reads
// text only, so an image or audio part is an error rather than silently dropped.
std::string text_content(const Json* content, const std::string& param) {
  if (!content || content->is_null()) return "";
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) {
    reject(param, "expected a string or an array of content parts, got " + describe(*content));
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content->size(); ++j) {
    const Json& part = (*content)[j];
    const std::string part_param = fmt::format("{}[{}]", param, j);
    if (part.is_string()) {
      texts.push_back(part.get<std::string>());
      continue;
    }
    expect_object(part, part_param);
    const Json* type = field(part, "type");
    if (!type) reject(part_param + ".type", "missing content part type");
    const std::string& type_name = expect_string(*type, part_param + ".type");
    if (type_name != "text" && type_name != "input_text" && type_name != "output_text") {
      reject(part_param + ".type",
             fmt::format("unsupported content part type '{}' (gpt-oss reads text only)", type_name));
    }
    const Json* text = field(part, "text");
    if (!text) reject(part_param + ".text", "missing text");
    texts.push_back(expect_string(*text, part_param + ".text"));
  }
  return fmt::format("{}", fmt::join(texts, "\n"));
}

// OpenAI's function-name rule (1-64 of a-z A-Z 0-9 _ -). Also what keeps `to=functions.NAME`
// one header word that the parser can read back.
bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string function_name(const Json& value, const std::string& param) {
  const std::string& name = expect_string(value, param);
  if (!valid_function_name(name)) {
    reject(param, fmt::format("invalid function name '{}': use 1-64 characters of a-z, A-Z, 0-9, "
                              "_ and -",
                              name));
  }
  return name;
}

class MessageConverter {
 public:
  explicit MessageConverter(Conversation& conversation) : conversation_(conversation) {}

  void convert(const Json& message, const std::string& param) {
    expect_object(message, param);
    const Json* role_value = field(message, "role");
    if (!role_value) reject(param + ".role", "missing role");
    const std::string& role = expect_string(*role_value, param + ".role");
    const Json* content = field(message, "content");
    if (role == "system" || role == "developer") {
      // Client system/developer text is the developer message's # Instructions (docs/reference/SPEC.md 5.10);
      // the system message itself is the server's.
      std::string text = text_content(content, param + ".content");
      if (!text.empty()) instructions_.push_back(std::move(text));
    } else if (role == "user") {
      conversation_.messages.push_back(user_message(text_content(content, param + ".content")));
    } else if (role == "assistant") {
      convert_assistant(message, param);
    } else if (role == "tool" || role == "function") {
      convert_tool_result(message, role, param);
    } else {
      reject(param + ".role", fmt::format("unknown role '{}' (expected system, developer, user, "
                                          "assistant or tool)",
                                          role));
    }
  }

  std::string instructions() const { return fmt::format("{}", fmt::join(instructions_, "\n\n")); }

 private:
  void convert_assistant(const Json& message, const std::string& param) {
    // OpenAI's `reasoning` and the vLLM/llama.cpp spelling `reasoning_content` are both accepted.
    for (const char* key : {"reasoning", "reasoning_content"}) {
      if (const Json* reasoning = given(message, key)) {
        const std::string& text = expect_string(*reasoning, fmt::format("{}.{}", param, key));
        if (!text.empty()) conversation_.messages.push_back(assistant_message("analysis", text));
        break;
      }
    }
    const Json* content = field(message, "content");
    std::string text = text_content(content, param + ".content");
    const Json* tool_calls = given(message, "tool_calls");
    if (tool_calls && !tool_calls->is_array()) {
      reject(param + ".tool_calls", "expected an array, got " + describe(*tool_calls));
    }
    if (!tool_calls || tool_calls->empty()) {
      if (content && !content->is_null()) {
        conversation_.messages.push_back(assistant_message("final", std::move(text)));
      }
      return;
    }
    // Text next to tool calls is what ossrt returns for a commentary preamble, so it goes back as
    // one (docs/reference/SPEC.md 5.4 "Preamble").
    if (!text.empty()) conversation_.messages.push_back(assistant_message("commentary", std::move(text)));
    for (size_t k = 0; k < tool_calls->size(); ++k) {
      convert_tool_call((*tool_calls)[k], fmt::format("{}.tool_calls[{}]", param, k));
    }
  }

  void convert_tool_call(const Json& call, const std::string& param) {
    expect_object(call, param);
    if (const Json* type = given(call, "type")) {
      if (expect_string(*type, param + ".type") != "function") {
        reject(param + ".type", "only function tool calls are supported");
      }
    }
    const Json* function = field(call, "function");
    if (!function) reject(param + ".function", "missing function");
    expect_object(*function, param + ".function");
    const Json* name_value = field(*function, "name");
    if (!name_value) reject(param + ".function.name", "missing function name");
    std::string name = function_name(*name_value, param + ".function.name");
    std::string arguments = "{}";
    if (const Json* args = given(*function, "arguments")) {
      // The API says string; some clients send the object itself.
      arguments = args->is_string() ? args->get<std::string>() : args->dump();
    }
    if (const Json* id = given(call, "id")) {
      call_names_[expect_string(*id, param + ".id")] = name;
    }
    conversation_.messages.push_back(function_call_message(name, std::move(arguments)));
  }

  void convert_tool_result(const Json& message, const std::string& role, const std::string& param) {
    std::string name;
    if (const Json* id = given(message, "tool_call_id")) {
      const std::string& call_id = expect_string(*id, param + ".tool_call_id");
      if (auto it = call_names_.find(call_id); it != call_names_.end()) name = it->second;
    }
    if (name.empty()) {
      if (const Json* name_value = given(message, "name")) {
        name = function_name(*name_value, param + ".name");
      }
    }
    if (name.empty()) {
      if (const Json* id = given(message, "tool_call_id")) {
        reject(param + ".tool_call_id",
               fmt::format("no earlier assistant tool call has id '{}'", id->get<std::string>()));
      }
      reject(role == "tool" ? param + ".tool_call_id" : param + ".name",
             "a tool result needs the tool_call_id of an earlier assistant tool call");
    }
    // Raw output, not JSON-encoded (docs/reference/SPEC.md 5.4: harmony and the reference server insert it as is).
    conversation_.messages.push_back(
        function_result_message(name, text_content(field(message, "content"), param + ".content")));
  }

  Conversation& conversation_;
  std::vector<std::string> instructions_;
  std::map<std::string, std::string> call_names_;  // tool_call id -> function name
};

std::vector<ToolDefinition> convert_tools(const Json& tools) {
  if (!tools.is_array()) reject("tools", "expected an array, got " + describe(tools));
  std::vector<ToolDefinition> result;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string param = fmt::format("tools[{}]", i);
    const Json& tool = tools[i];
    expect_object(tool, param);
    const Json* type = field(tool, "type");
    if (!type) reject(param + ".type", "missing tool type");
    if (expect_string(*type, param + ".type") != "function") {
      reject(param + ".type", fmt::format("unsupported tool type '{}' (only 'function')", type->get<std::string>()));
    }
    const Json* function = field(tool, "function");
    if (!function) reject(param + ".function", "missing function");
    expect_object(*function, param + ".function");
    const Json* name = field(*function, "name");
    if (!name) reject(param + ".function.name", "missing function name");
    ToolDefinition definition;
    definition.name = function_name(*name, param + ".function.name");
    if (!seen.insert(definition.name).second) {
      reject(param + ".function.name", fmt::format("duplicate function name '{}'", definition.name));
    }
    if (const Json* description = given(*function, "description")) {
      definition.description = expect_string(*description, param + ".function.description");
    }
    if (const Json* parameters = given(*function, "parameters")) {
      expect_object(*parameters, param + ".function.parameters");
      definition.parameters = *parameters;
    }
    result.push_back(std::move(definition));
  }
  return result;
}

void apply_tool_choice(const Json& body, ChatConversation& out) {
  const Json* choice = given(body, "tool_choice");
  if (!choice) return;
  const auto declared = [&](const std::string& name) {
    for (const ToolDefinition& tool : out.conversation.tools) {
      if (tool.name == name) return true;
    }
    return false;
  };
  if (choice->is_string()) {
    const std::string& mode = choice->get_ref<const std::string&>();
    if (mode == "auto") {
      out.tool_choice = ToolChoice::Auto;
    } else if (mode == "none") {
      out.tool_choice = ToolChoice::None;
    } else if (mode == "required") {
      if (out.conversation.tools.empty()) reject("tool_choice", "'required' needs at least one tool in 'tools'");
      out.tool_choice = ToolChoice::Required;
    } else {
      reject("tool_choice", fmt::format("unknown mode '{}' (expected none, auto, required or an object "
                                        "naming a function)",
                                        mode));
    }
  } else {
    expect_object(*choice, "tool_choice");
    const Json* function = field(*choice, "function");
    if (!function) reject("tool_choice.function", "missing function");
    expect_object(*function, "tool_choice.function");
    const Json* name = field(*function, "name");
    if (!name) reject("tool_choice.function.name", "missing function name");
    const std::string& wanted = expect_string(*name, "tool_choice.function.name");
    if (!declared(wanted)) {
      reject("tool_choice.function.name", fmt::format("function '{}' is not in 'tools'", wanted));
    }
    out.tool_choice = ToolChoice::Named;
    out.forced_tool = wanted;
  }
  // With tool_choice none the model must not see the tools at all; past calls stay in history.
  if (out.tool_choice == ToolChoice::None) out.conversation.tools.clear();
}

void apply_reasoning_effort(const Json& body, const ChatRequestOptions& options, ChatConversation& out) {
  out.conversation.system.effort = options.default_effort;
  // One field, first found wins: OpenAI's top-level name, the Responses-style object, then the
  // HF/vLLM chat-template kwarg.
  const Json* value = nullptr;
  std::string param;
  if ((value = given(body, "reasoning_effort"))) {
    param = "reasoning_effort";
  } else if (const Json* reasoning = given(body, "reasoning");
             reasoning && reasoning->is_object() && (value = given(*reasoning, "effort"))) {
    param = "reasoning.effort";
  } else if (const Json* kwargs = given(body, "chat_template_kwargs");
             kwargs && kwargs->is_object() && (value = given(*kwargs, "reasoning_effort"))) {
    param = "chat_template_kwargs.reasoning_effort";
  }
  if (!value) return;
  std::optional<ReasoningEffort> effort = parse_reasoning_effort(expect_string(*value, param));
  if (!effort) {
    reject(param,
           fmt::format("unknown reasoning effort '{}' (expected low, medium or high)", value->get<std::string>()));
  }
  out.conversation.system.effort = *effort;
  out.effort_from_request = true;
}

void apply_response_format(const Json& body, Conversation& conversation) {
  const Json* format = given(body, "response_format");
  if (!format) return;
  expect_object(*format, "response_format");
  const Json* type = field(*format, "type");
  if (!type) reject("response_format.type", "missing type");
  const std::string& kind = expect_string(*type, "response_format.type");
  if (kind == "text") return;
  ResponseFormat result;
  if (kind == "json_object") {
    result.kind = ResponseFormat::Kind::JsonObject;
    result.name = "json_object";
    result.schema = Json{{"type", "object"}};
  } else if (kind == "json_schema") {
    const Json* spec = field(*format, "json_schema");
    if (!spec) reject("response_format.json_schema", "missing json_schema");
    expect_object(*spec, "response_format.json_schema");
    const Json* name = field(*spec, "name");
    if (!name) reject("response_format.json_schema.name", "missing name");
    result.kind = ResponseFormat::Kind::JsonSchema;
    result.name = expect_string(*name, "response_format.json_schema.name");
    if (const Json* description = given(*spec, "description")) {
      result.description = expect_string(*description, "response_format.json_schema.description");
    }
    result.schema = Json{{"type", "object"}};
    if (const Json* schema = given(*spec, "schema")) {
      expect_object(*schema, "response_format.json_schema.schema");
      result.schema = *schema;
    }
  } else {
    reject("response_format.type", fmt::format("unknown type '{}' (expected text, json_object or json_schema)", kind));
  }
  conversation.response_format = std::move(result);
}

}  // namespace

HarmonyRequestError::HarmonyRequestError(std::string param, const std::string& message)
    : ossrt::Error(fmt::format("{}: {}", param, message)), param_(std::move(param)) {}

std::string today_utc_date() {
  const auto today = std::chrono::floor<std::chrono::days>(std::chrono::system_clock::now());
  const std::chrono::year_month_day ymd{today};
  return fmt::format("{:04}-{:02}-{:02}", static_cast<int>(ymd.year()), static_cast<unsigned>(ymd.month()),
                     static_cast<unsigned>(ymd.day()));
}

bool is_valid_date(std::string_view text) {
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9}) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  const auto number = [&](size_t at, size_t len) {
    int value = 0;
    for (size_t i = at; i < at + len; ++i) value = value * 10 + (text[i] - '0');
    return value;
  };
  const std::chrono::year_month_day ymd{std::chrono::year{number(0, 4)},
                                        std::chrono::month{static_cast<unsigned>(number(5, 2))},
                                        std::chrono::day{static_cast<unsigned>(number(8, 2))}};
  return ymd.ok();
}

std::optional<ReasoningEffort> parse_reasoning_effort(std::string_view text) {
  if (text == "low" || text == "minimal") return ReasoningEffort::Low;
  if (text == "medium") return ReasoningEffort::Medium;
  if (text == "high") return ReasoningEffort::High;
  return std::nullopt;
}

ChatConversation conversation_from_chat_request(const Json& body, const ChatRequestOptions& options) {
  if (!body.is_object()) reject("body", "expected a JSON object, got " + describe(body));
  ChatConversation out;
  out.conversation.system.current_date = options.current_date;

  if (const Json* tools = given(body, "tools")) out.conversation.tools = convert_tools(*tools);
  apply_tool_choice(body, out);
  apply_reasoning_effort(body, options, out);
  apply_response_format(body, out.conversation);

  const Json* messages = field(body, "messages");
  if (!messages) reject("messages", "missing messages");
  if (!messages->is_array()) reject("messages", "expected an array, got " + describe(*messages));
  if (messages->empty()) reject("messages", "must contain at least one message");
  MessageConverter converter(out.conversation);
  for (size_t i = 0; i < messages->size(); ++i) {
    converter.convert((*messages)[i], fmt::format("messages[{}]", i));
  }
  out.conversation.developer_instructions = converter.instructions();
  return out;
}

}  // namespace ossrt::harmony
