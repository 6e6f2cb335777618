// The two table formats the commands print and write: markdown (GitHub's pipe tables, for the
// terminal and for pasting into docs) and CSV (RFC 4180, for spreadsheets and scripts). The
// cells come formatted: each command keeps its own digits.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace k3::cli {

// A markdown table: the header, its rule ("|---|", "---:|" for a right-aligned column), then
// a line per row, each ending in '\n'. A '|' in a cell is escaped.
class MarkdownTable {
 public:
  // `right_aligned[i]`: column i holds numbers (missing entries: left-aligned).
  explicit MarkdownTable(const std::vector<std::string>& header,
                         const std::vector<bool>& right_aligned = {}) {
    AddRow(header);
    text_ += "|";
    for (size_t i = 0; i < header.size(); ++i) {
      text_ += i < right_aligned.size() && right_aligned[i] ? "---:|" : "---|";
    }
    text_ += "\n";
  }

  void AddRow(const std::vector<std::string>& cells) {
    text_ += "|";
    for (const std::string& cell : cells) {
      absl::StrAppend(&text_, " ", absl::StrReplaceAll(cell, {{"|", "\\|"}}), " |");
    }
    text_ += "\n";
  }

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// CSV: the header line of column names, then a line per row, each ending in '\n'. Text cells
// go through Text (quoted, so that a path or a storage profile with a comma stays one cell);
// numbers go as formatted, an empty cell where there is none.
class CsvTable {
 public:
  explicit CsvTable(const std::vector<std::string>& columns) { AddRow(columns); }

  static std::string Text(const std::string& s) {
    return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
  }

  void AddRow(const std::vector<std::string>& cells) {
    absl::StrAppend(&text_, absl::StrJoin(cells, ","), "\n");
  }

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

}  // namespace k3::cli
