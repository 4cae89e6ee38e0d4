#include "harmony/builtin_tools.h"

namespace ossrt::harmony {
namespace {

using Json = nlohmann::ordered_json;

// A number property with harmony's `-1` "not given" default.
Json number_default(int value) { return Json{{"type", "number"}, {"default", value}}; }

}  // namespace

ToolNamespace browser_tool_namespace() {
  ToolNamespace ns;
  ns.name = "browser";
  ns.description =
      "Tool for browsing.\n"
      "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
      "Cite information from the tool using the following format:\n"
      "`\u3010{cursor}\u2020L{line_start}(-L{line_end})?\u3011`, for example: `\u30106\u2020L9-L11\u3011` or "
      "`\u30108\u2020L3\u3011`.\n"
      "Do not quote more than 10 words directly from the tool output.\n"
      "sources=web (default: web)";

  ToolDefinition search;
  search.name = "search";
  search.description = "Searches for information related to `query` and displays `topn` results.";
  search.parameters = Json{
      {"type", "object"},
      {"properties",
       Json{{"query", Json{{"type", "string"}}}, {"topn", number_default(10)}, {"source", Json{{"type", "string"}}}}},
      {"required", Json::array({"query"})}};

  ToolDefinition open;
  open.name = "open";
  open.description =
      "Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, "
      "showing `num_lines` lines.\n"
      "Valid link ids are displayed with the formatting: `\u3010{id}\u2020.*\u3011`.\n"
      "If `cursor` is not provided, the most recent page is implied.\n"
      "If `id` is a string, it is treated as a fully qualified URL associated with `source`.\n"
      "If `loc` is not provided, the viewport will be positioned at the beginning of the document "
      "or centered on the most relevant passage, if available.\n"
      "Use this function without `id` to scroll to a new location of an opened page.";
  open.parameters = Json{{"type", "object"},
                         {"properties", Json{{"id", Json{{"type", Json::array({"number", "string"})}, {"default", -1}}},
                                             {"cursor", number_default(-1)},
                                             {"loc", number_default(-1)},
                                             {"num_lines", number_default(-1)},
                                             {"view_source", Json{{"type", "boolean"}, {"default", false}}},
                                             {"source", Json{{"type", "string"}}}}}};

  ToolDefinition find;
  find.name = "find";
  find.description = "Finds exact matches of `pattern` in the current page, or the page given by `cursor`.";
  find.parameters = Json{{"type", "object"},
                         {"properties", Json{{"pattern", Json{{"type", "string"}}}, {"cursor", number_default(-1)}}},
                         {"required", Json::array({"pattern"})}};

  ns.tools = {search, open, find};
  return ns;
}

ToolNamespace python_tool_namespace() {
  ToolNamespace ns;
  ns.name = "python";
  ns.description =
      "Use this tool to execute Python code in your chain of thought. The code will not be shown "
      "to the user. This tool should be used for internal reasoning, but not for code that is "
      "intended to be visible to the user (e.g. when creating plots, tables, or files).\n"
      "\n"
      "When you send a message containing Python code to python, it will be executed in a "
      "stateful Jupyter notebook environment. python will respond with the output of the "
      "execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save "
      "and persist user files. Internet access for this session is UNKNOWN. Depends on the "
      "cluster.";
  return ns;
}

}  // namespace ossrt::harmony
