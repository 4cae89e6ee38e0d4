#pragma once
// JSON Schema -> Grammar. Covers what structured-output clients send (OpenAI strict schemas,
// zod / pydantic output): type (and type lists), properties / required / additionalProperties /
// propertyNames / min-maxProperties (maps), enum, const, anyOf, oneOf (as anyOf), allOf (merged
// when its members do not conflict), $ref to "#..." pointers ($defs, definitions, recursion),
// items / prefixItems / additionalItems / minItems / maxItems, minLength / maxLength / pattern /
// format, minimum / maximum / exclusiveMinimum / exclusiveMaximum, nullable.
//
// The generated JSON is compact (no whitespace) and declared properties come in schema order;
// the subset rules for leaves are in json_leaves.h. Keywords with validation meaning that cannot
// be enforced (not, if/then/else, contains, uniqueItems, patternProperties, dependent*, ...) are
// refused with StructuredError naming them; annotations and unknown keywords are ignored, as
// JSON Schema says. Size and depth are bounded: schemas come from untrusted clients.
#include <nlohmann/json.hpp>

#include "structured/grammar.h"

namespace ossrt::structured {

struct JsonSchemaOptions {
  int max_depth = 64;           // nesting of subschemas (a $ref restarts the count)
  int max_subschemas = 10'000;  // subschemas compiled in total
};

// Throws StructuredError whose where() is the JSON pointer of the offending keyword.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

// Any JSON object (response_format {"type": "json_object"}).
Grammar json_object_grammar();

}  // namespace ossrt::structured
