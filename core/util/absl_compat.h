// Debian's Abseil is built with its own absl::string_view, so absl::StrCat and friends do not
// take std::string_view; our interfaces keep std::string_view and convert at the call.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace k3::tokenizer_internal {

inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace k3::tokenizer_internal
