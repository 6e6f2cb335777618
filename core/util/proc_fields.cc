#include "core/util/proc_fields.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace k3 {

uint64_t ProcField(const std::string& path, std::string_view field) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || std::string_view(line).substr(0, colon) != field) continue;
    const std::pair<absl::string_view, absl::string_view> value_unit =
        absl::StrSplit(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)),
                       absl::MaxSplits(' ', 1));
    uint64_t value = 0;
    if (!absl::SimpleAtoi(value_unit.first, &value)) return 0;
    return absl::StripAsciiWhitespace(value_unit.second) == "kB" ? value * 1024 : value;
  }
  return 0;
}

}  // namespace k3
