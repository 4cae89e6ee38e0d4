// JSON schema -> Harmony's TypeScript-like tool signatures. Written to reproduce harmony's
// json_schema_to_typescript output byte for byte (docs/reference/SPEC.md 5.3), because that text is what gpt-oss
// saw in training; the two extensions (untyped `enum`, `anyOf`) only touch schemas harmony would
// render as a bare `any`.
#include "harmony/typescript_schema.h"

#include <fmt/format.h>

#include <unordered_set>

#include "harmony/prompt_too_long.h"

namespace ossrt::harmony {
namespace {

using Json = nlohmann::ordered_json;

// Member lookup that tolerates non-object schemas (`true`, a string...): those have no members.
const Json* member(const Json& schema, const char* key) {
  if (!schema.is_object()) return nullptr;
  auto it = schema.find(key);
  return it == schema.end() ? nullptr : &*it;
}

const std::string* string_member(const Json& schema, const char* key) {
  const Json* value = member(schema, key);
  return value && value->is_string() ? value->get_ptr<const std::string*>() : nullptr;
}

bool has_enum(const Json& schema) {
  const Json* values = member(schema, "enum");
  return values && values->is_array() && !values->empty();
}

bool is_nullable(const Json& schema) {
  const Json* nullable = member(schema, "nullable");
  return nullable && nullable->is_boolean() && nullable->get<bool>();
}

// harmony quotes a string default unless the property is an enum (the enum members are already
// shown quoted); anything else is compact JSON.
std::string default_text(const Json& schema, const Json& value) {
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    return has_enum(schema) ? fmt::format("default: {}", text) : fmt::format("default: \"{}\"", text);
  }
  return fmt::format("default: {}", value.dump());
}

std::string with_nullable(const Json& schema, std::string type) {
  if (is_nullable(schema) && type.find("null") == std::string::npos) type += " | null";
  return type;
}

std::string union_of_variants(const Json& variants, std::string_view indent, const RenderBudget& budget) {
  std::string out;
  for (const Json& variant : variants) {
    out += fmt::format("\n{} | ", indent);
    out += with_nullable(variant, schema_to_typescript(variant, fmt::format("{}   ", indent), budget));
    std::vector<std::string> comments;
    if (const std::string* desc = string_member(variant, "description")) comments.push_back(*desc);
    if (const Json* def = member(variant, "default")) {
      // Unlike property defaults, harmony prints an enum's string default here as JSON (quoted).
      comments.push_back(def->is_string() && !has_enum(variant) ? default_text(variant, *def)
                                                                : "default: " + def->dump());
    }
    if (!comments.empty()) out += " // " + fmt::format("{}", fmt::join(comments, " "));
    budget.check(out.size());
  }
  return out;
}

// A property whose schema is a oneOf: comments above, then one ` | TYPE` line per variant.
void append_one_of_property(std::string& out, std::string_view indent, const std::string& key, bool required,
                            const Json& property, const Json& variants, const RenderBudget& budget) {
  const std::string* property_desc = string_member(property, "description");
  bool desc_above = false;
  if (property_desc) {
    // harmony skips the property description when the first variant repeats it.
    const std::string* first_desc = variants.empty() ? nullptr : string_member(variants.front(), "description");
    if (!(first_desc && *first_desc == *property_desc)) {
      out += fmt::format("{}// {}\n", indent, *property_desc);
      desc_above = true;
    }
  }
  if (const Json* def = member(property, "default")) {
    out += fmt::format("{}// {}\n", indent, default_text(property, *def));
  }
  out += fmt::format("{}{}{}:\n", indent, key, required ? "" : "?");
  for (size_t i = 0; i < variants.size(); ++i) {
    const Json& variant = variants[i];
    out += fmt::format("{} | ", indent);
    out += with_nullable(variant, schema_to_typescript(variant, fmt::format("{}   ", indent), budget));
    std::vector<std::string> comments;
    const std::string* desc = string_member(variant, "description");
    if (desc && !(i == 0 && desc_above) && !(property_desc && *desc == *property_desc)) {
      comments.push_back(*desc);
    }
    if (const Json* def = member(variant, "default")) comments.push_back(default_text(variant, *def));
    if (!comments.empty()) out += " // " + fmt::format("{}", fmt::join(comments, " "));
    out += "\n";
    budget.check(out.size());
  }
  out += fmt::format("{},\n", indent);
}

std::string object_type(const Json& schema, std::string_view indent, const RenderBudget& budget) {
  std::string out;
  if (const std::string* desc = string_member(schema, "description")) {
    out += fmt::format("{}// {}\n", indent, *desc);
  }
  out += "{\n";
  std::unordered_set<std::string> required;
  if (const Json* names = member(schema, "required"); names && names->is_array()) {
    for (const Json& name : *names) {
      if (name.is_string()) required.insert(name.get<std::string>());
    }
  }
  const Json* properties = member(schema, "properties");
  if (properties && properties->is_object()) {
    for (const auto& [key, property] : properties->items()) {
      const bool is_required = required.contains(key);
      if (const std::string* title = string_member(property, "title")) {
        out += fmt::format("{0}// {1}\n{0}//\n", indent, *title);
      }
      const Json* one_of = member(property, "oneOf");
      if (!one_of) {
        if (const std::string* desc = string_member(property, "description")) {
          out += fmt::format("{}// {}\n", indent, *desc);
        }
      }
      if (const Json* examples = member(property, "examples"); examples && examples->is_array() && !examples->empty()) {
        out += fmt::format("{}// Examples:\n", indent);
        for (const Json& example : *examples) {
          if (example.is_string()) {
            out += fmt::format("{}// - \"{}\"\n", indent, example.get_ref<const std::string&>());
          }
        }
      }
      if (one_of && one_of->is_array()) {
        append_one_of_property(out, indent, key, is_required, property, *one_of, budget);
        budget.check(out.size());
        continue;
      }
      out += fmt::format("{}{}{}: ", indent, key, is_required ? "" : "?");
      out += with_nullable(property, schema_to_typescript(property, fmt::format("{}    ", indent), budget));
      out += ",";
      if (!one_of) {
        if (const Json* def = member(property, "default")) out += " // " + default_text(property, *def);
      }
      out += "\n";
      budget.check(out.size());
    }
  }
  out += fmt::format("{}}}", indent);
  return out;
}

std::string literal_union(const Json& values) {
  std::vector<std::string> members;
  for (const Json& value : values) {
    members.push_back(value.is_string() ? fmt::format("\"{}\"", value.get_ref<const std::string&>()) : value.dump());
  }
  return fmt::format("{}", fmt::join(members, " | "));
}

std::vector<std::string_view> split_lines(std::string_view text) {
  // Like Rust's str::lines(): no final empty line for a trailing "\n", "\r\n" counts as "\n".
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (line.ends_with('\r')) line.remove_suffix(1);
    lines.push_back(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

}  // namespace

void RenderBudget::check(size_t bytes) const {
  if (bytes > max_bytes) throw PromptTooLong(max_tokens);
}

std::string schema_to_typescript(const Json& schema, std::string_view indent, const RenderBudget& budget) {
  if (const Json* one_of = member(schema, "oneOf"); one_of && one_of->is_array()) {
    return union_of_variants(*one_of, indent, budget);
  }
  const Json* type = member(schema, "type");
  if (type && type->is_array()) {
    std::vector<std::string> members;
    for (const Json& t : *type) {
      if (t.is_string()) members.push_back(t == "integer" ? "number" : t.get<std::string>());
    }
    if (!members.empty()) return fmt::format("{}", fmt::join(members, " | "));
  }
  if (type && type->is_string()) {
    const auto& name = type->get_ref<const std::string&>();
    if (name == "object") return object_type(schema, indent, budget);
    if (name == "string") {
      const Json* values = member(schema, "enum");
      if (values && values->is_array()) {
        std::vector<std::string> quoted;
        for (const Json& v : *values) {
          if (v.is_string()) quoted.push_back(fmt::format("\"{}\"", v.get_ref<const std::string&>()));
        }
        if (!quoted.empty()) return fmt::format("{}", fmt::join(quoted, " | "));
      }
      return "string";
    }
    if (name == "number" || name == "integer") return "number";
    if (name == "boolean") return "boolean";
    if (name == "array") {
      const Json* items = member(schema, "items");
      return items ? schema_to_typescript(*items, indent, budget) + "[]" : "Array<any>";
    }
    return "any";
  }
  // Extensions for untyped schemas (harmony: `any`): an enum lists its values, anyOf its members.
  if (!type) {
    if (has_enum(schema)) return literal_union(*member(schema, "enum"));
    if (const Json* any_of = member(schema, "anyOf"); any_of && any_of->is_array() && !any_of->empty()) {
      std::vector<std::string> members;
      for (const Json& variant : *any_of) {
        members.push_back(with_nullable(variant, schema_to_typescript(variant, indent, budget)));
        budget.check(members.back().size());
      }
      return fmt::format("{}", fmt::join(members, " | "));
    }
  }
  return "any";
}

std::string tools_section(const std::vector<ToolNamespace>& namespaces, const RenderBudget& budget) {
  std::vector<std::string> sections = {"# Tools"};
  size_t rendered = 0;  // bytes of tool signatures so far, against the budget
  for (const ToolNamespace& ns : namespaces) {
    std::vector<std::string> parts = {fmt::format("## {}\n", ns.name)};
    const bool has_tools = !ns.tools.empty();
    for (std::string_view line : split_lines(ns.description)) {
      parts.push_back(has_tools ? fmt::format("// {}", line) : std::string(line));
    }
    if (has_tools) {
      parts.push_back(fmt::format("namespace {} {{\n", ns.name));
      for (const ToolDefinition& tool : ns.tools) {
        for (std::string_view line : split_lines(tool.description)) parts.push_back(fmt::format("// {}", line));
        if (tool.parameters.is_null()) {
          parts.push_back(fmt::format("type {} = () => any;\n", tool.name));
        } else {
          parts.push_back(
              fmt::format("type {} = (_: {}) => any;\n", tool.name, schema_to_typescript(tool.parameters, "", budget)));
        }
        rendered += parts.back().size();
        budget.check(rendered);
      }
      parts.push_back(fmt::format("}} // namespace {}", ns.name));
    }
    sections.push_back(fmt::format("{}", fmt::join(parts, "\n")));
  }
  return fmt::format("{}", fmt::join(sections, "\n\n"));
}

}  // namespace ossrt::harmony
