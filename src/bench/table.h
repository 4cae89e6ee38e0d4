#pragma once
// Plain-text tables for the benchmark reports: columns sized to their widest cell, numbers right-
// aligned, text left-aligned, a rule under the header. Also CSV with RFC 4180 quoting.
#include <string>
#include <vector>

namespace ossrt::bench {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const;
  std::string csv() const;
  size_t rows() const { return rows_.size(); }

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// A CSV field, quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s);
// Writes `text` to `dir/name` (creating dir); throws ossrt::Error on failure. Returns the path.
std::string write_text_file(const std::string& dir, const std::string& name, const std::string& text);

}  // namespace ossrt::bench
