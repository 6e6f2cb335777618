// Parsers for the tokenizer files of a Kimi checkpoint (MODEL.md 4.1): `tiktoken.model` and the
// `added_tokens_decoder` of `tokenizer_config.json`. Errors name the file and, where the input
// is line-oriented, the line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace k3::tokenizer_internal {

// Ranks above this are refused: the decode table is indexed by rank, and a corrupt rank must
// not turn into a huge allocation (real vocabularies stay below 1M).
inline constexpr int64_t kMaxRank = (int64_t{1} << 24) - 1;

// One line of tiktoken.model: the raw token bytes and their rank (= token id).
struct RankedBytes {
  std::string bytes;
  int64_t rank = 0;
};

// Each non-empty line is "<base64 of the bytes> <decimal rank>" (a trailing CR is ignored, as
// empty lines are by tiktoken's loader). Refuses, naming "<file_name>:<line>": a missing or
// extra field, malformed or non-canonical base64, an empty token, a rank that is not a
// non-negative decimal integer <= kMaxRank, and a rank or token bytes given twice.
absl::StatusOr<std::vector<RankedBytes>> ParseTiktokenModel(std::string_view contents,
                                                            std::string_view file_name);

// The id -> content pairs of `added_tokens_decoder` (none when the key is absent), in id order.
// Refuses invalid JSON (with line and column), a key that is not a decimal id, and an entry
// without a non-empty string `content`.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ParseAddedTokens(
    std::string_view contents, std::string_view file_name);

// Strict standard base64 (RFC 4648 alphabet, '=' padding required, zero pad bits).
bool DecodeBase64(std::string_view text, std::string* out);

absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace k3::tokenizer_internal
