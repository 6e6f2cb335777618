// JSON written and read the way Kimi K3's reference renderer (Python) does, so that a rendered
// prompt matches the release's token for token (../shared/spec/TOOLS.md sections 4 and 5).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nlohmann/json.hpp"

namespace k3 {

// json.dumps(value, ensure_ascii=False) with `compact` separators (",", ":") or the default
// ones (", ", ": "). Objects keep the order of their container: nlohmann::json's keys are
// sorted by code point (Python's deep sort), ordered_json's keep insertion order. Floats are
// Python's repr (1e+16, 1e-05, 100.0, -0.0); integers are exact within 64 bits.
std::string PythonJsonDumps(const nlohmann::json& value, bool compact);
std::string PythonJsonDumps(const nlohmann::ordered_json& value, bool compact);

// One top-level pair of a tool call's `arguments` string, as the reference's one-level parse
// reads it: a string value decoded, any other value the exact slice of the original text.
struct ArgumentPair {
  std::string key;
  std::string value;  // the text the argument tag holds
  std::string type;   // its XTML type: string, number, boolean, null, object or array
};

// The reference's one-level parse of an `arguments` string: whitespace, `{`, then pairs of a
// JSON string key, `:` and a JSON value, each followed by `,` or a closing `}` (text after it
// is ignored). Duplicate keys are kept. Nullopt when the text is not such an object (the
// renderer then writes it verbatim in a `json` block).
std::optional<std::vector<ArgumentPair>> ParseArgumentsOneLevel(std::string_view text);

}  // namespace k3
