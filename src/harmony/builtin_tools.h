#pragma once
// The builtin tool namespaces of harmony's system message (docs/reference/SPEC.md 5.6): `browser` and `python`.
// Their text is fixed by training (fixture test_browser_and_python_tool.txt), so it lives here as
// data and is only ever rendered when a tool server provides these tools.
#include "harmony/typescript_schema.h"

namespace ossrt::harmony {

ToolNamespace browser_tool_namespace();
ToolNamespace python_tool_namespace();

}  // namespace ossrt::harmony
