#pragma once
// JSON schema -> the TypeScript-like text of Harmony's `# Tools` section (docs/reference/SPEC.md 5.3). The rules
// follow harmony's json_schema_to_typescript exactly (that is what the model was trained on),
// including its oddities (duplicated object descriptions, indentation of nested closing braces).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "harmony/conversation.h"

namespace ossrt::harmony {

// The text budget of a rendering: a schema whose text would pass `max_bytes` throws PromptTooLong
// naming `max_tokens` (the limit the budget was derived from). Rendering is linear in the schema's
// size times its nesting depth (every nested line carries its indentation, as in harmony), and
// callers bound the depth (the server's JSON depth limit), so the check keeps it linear.
struct RenderBudget {
  size_t max_bytes = SIZE_MAX;
  size_t max_tokens = SIZE_MAX;
  void check(size_t bytes) const;
};

// The type text for `schema` whose property lines are indented by `indent`.
std::string schema_to_typescript(const nlohmann::ordered_json& schema, std::string_view indent,
                                 const RenderBudget& budget = {});

// A tool namespace: `functions` (client tools, developer message) or a builtin one (`browser`,
// `python`, system message). A namespace without tools renders its description only.
struct ToolNamespace {
  std::string name;
  std::string description;  // may span lines
  std::vector<ToolDefinition> tools;
};

// "# Tools\n\n## NS\n\n[// desc\n]namespace NS {\n\n// tool desc\ntype f = (_: {...}) => any;\n\n
// } // namespace NS", namespaces separated by a blank line, in the given order.
std::string tools_section(const std::vector<ToolNamespace>& namespaces, const RenderBudget& budget = {});

}  // namespace ossrt::harmony
