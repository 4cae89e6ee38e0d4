#include "bench/table.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ossrt::bench {

namespace {
bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) {
                       return (c >= '0' && c <= '9') || c == '.' || c == '-' || c == ',' || c == 'e' || c == '+' ||
                              c == '%' || c == 'x';
                     }) &&
         (s[0] == '-' || (s[0] >= '0' && s[0] <= '9') || s[0] == '.');
}
}  // namespace

std::string TextTable::str() const {
  std::vector<size_t> width(header_.size(), 0);
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& row : rows_)
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string out;
  auto line = [&](const std::vector<std::string>& row, bool header) {
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      const size_t pad = width[c] - cell.size();
      if (c > 0) out += "  ";
      if (!header && looks_numeric(cell))
        out += std::string(pad, ' ') + cell;
      else
        out += cell + (c + 1 < width.size() ? std::string(pad, ' ') : "");
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  line(header_, true);
  size_t total = 0;
  for (size_t w : width) total += w;
  out += std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') + '\n';
  for (const auto& row : rows_) line(row, false);
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string TextTable::csv() const {
  std::string out;
  auto line = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size(); ++c) {
      if (c) out += ',';
      out += csv_field(row[c]);
    }
    out += "\n";
  };
  line(header_);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string write_text_file(const std::string& dir, const std::string& name, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  OSSRT_CHECK(!ec, "--result-dir {}: cannot create it: {}", dir, ec.message());
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream out(path, std::ios::binary);
  OSSRT_CHECK(out, "cannot write {}", path);
  out << text;
  OSSRT_CHECK(out.good(), "cannot write {}", path);
  return path;
}

}  // namespace ossrt::bench
