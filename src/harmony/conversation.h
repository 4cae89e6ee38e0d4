#pragma once
// Native Harmony conversation types: what the renderer consumes and the parser produces. No JSON
// request shapes here (chat_request.h converts OpenAI bodies into these), so the server, `ossrt
// chat` and tests all build conversations the same way.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ossrt::harmony {

enum class Role { System, Developer, User, Assistant, Tool };

// "system", "developer", "user", "assistant", "tool".
std::string_view role_name(Role role);
// Inverse of role_name for the four non-tool roles (and "tool"); nullopt otherwise.
std::optional<Role> role_from_name(std::string_view name);

// Where " to=RECIPIENT" goes in the header. The model itself writes it after the channel
// (`<|channel|>commentary to=functions.f <|constrain|>json`), harmony's renderer and format.md
// write tool results with it before (`functions.f to=assistant<|channel|>commentary`). Re-rendering
// history should reproduce the tokens the model generated (docs/reference/SPEC.md 5.4), so the parser records the
// placement it saw and Auto picks the form each role is trained on.
enum class RecipientPlacement {
  Auto,  // assistant: after the channel; every other role: before the channel
  BeforeChannel,
  AfterChannel,
};

struct Message {
  Role role = Role::User;
  // Tool messages: the tool's full name, rendered as the author ("functions.get_weather",
  // "browser.search", "python"). Other roles: an optional name rendered as "role:name" (rare).
  std::string author_name;
  std::string recipient;     // "functions.NAME" for calls, "assistant" for tool results, or empty
  std::string channel;       // "analysis" | "commentary" | "final" | empty
  std::string content_type;  // "<|constrain|>json" (special token + "json"), "json", "code" or empty
  std::string content;
  RecipientPlacement recipient_placement = RecipientPlacement::Auto;

  bool operator==(const Message&) const = default;
};

// A function tool (always in namespace `functions`). Parameters keep the JSON property order of
// the request (ordered_json): the TypeScript rendering lists properties in that order, and the
// model sees exactly that text.
struct ToolDefinition {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON-schema object, or null for `() => any`
};

enum class ReasoningEffort { Low, Medium, High };
std::string_view effort_name(ReasoningEffort effort);  // "low" | "medium" | "high"

// OpenAI `response_format`. Rendered as a `# Response Formats` section of the developer message
// (docs/reference/SPEC.md 5.7). It only steers the model; enforcing it is the sampler's (grammar) job.
struct ResponseFormat {
  enum class Kind { JsonObject, JsonSchema };
  Kind kind = Kind::JsonObject;
  std::string name;               // json_schema.name ("json_object" for JsonObject)
  std::string description;        // optional
  nlohmann::ordered_json schema;  // json_schema.schema ({"type":"object"} for JsonObject)
};

// The system message the server generates (docs/reference/SPEC.md 5.2). Defaults are harmony's, except that the
// current date is set by callers (the server and `ossrt render` use today's date).
struct SystemOptions {
  std::string model_identity = "You are ChatGPT, a large language model trained by OpenAI.";
  std::string knowledge_cutoff = "2024-06";
  std::optional<std::string> current_date;  // YYYY-MM-DD; absent -> no "Current date:" line
  ReasoningEffort effort = ReasoningEffort::Medium;
  std::vector<std::string> valid_channels = {"analysis", "commentary", "final"};
  // Builtin tools, rendered in the system message (docs/reference/SPEC.md 5.6). Off unless a tool server exists.
  bool browser_tool = false;
  bool python_tool = false;
};

struct Conversation {
  SystemOptions system;
  std::string developer_instructions;  // empty -> no "# Instructions" section
  std::vector<ToolDefinition> tools;   // the `functions` namespace; empty -> no "# Tools"
  std::optional<ResponseFormat> response_format;
  std::vector<Message> messages;  // user / assistant / tool messages, in order
};

// Convenience constructors for the common message shapes (docs/reference/SPEC.md 5.4).
Message user_message(std::string text);
Message assistant_message(std::string channel, std::string text);
// An assistant function call: commentary, to=functions.NAME, <|constrain|>json, JSON arguments.
Message function_call_message(std::string_view function_name, std::string arguments_json);
// A function result: author functions.NAME, to=assistant, commentary.
Message function_result_message(std::string_view function_name, std::string output);

// "functions.get_weather" -> "get_weather"; nullopt for anything not in the functions namespace
// or with an empty name. The server uses this to turn a parsed recipient into tool_calls[].name.
std::optional<std::string> function_name_from_recipient(std::string_view recipient);

}  // namespace ossrt::harmony
