#pragma once
// Errors from compiling a client's schema, regex or grammar. They are request errors (HTTP 400):
// `where()` says where in the client's input the problem is: a JSON pointer into a schema
// ("/properties/age/minimum"), or "position N" in a regex or grammar text.
#include <string>

#include "core/error_type.h"

namespace ossrt::structured {

class StructuredError : public ossrt::Error {
 public:
  StructuredError(std::string where, const std::string& message)
      : ossrt::Error(where.empty() ? message : where + ": " + message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

}  // namespace ossrt::structured
