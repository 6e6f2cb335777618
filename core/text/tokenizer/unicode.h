// UTF-8 helpers for the tokenizer: repair of ill-formed input and the chunking that Kimi's
// official encode applies before the regex (MODEL.md 4.2 step 2).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tokenizer_internal {

// The limits of the official encode (tokenization_kimi.py): tiktoken is fed slices of at most
// 400,000 characters, each cut so that no piece holds a run of more than 25,000 whitespace or
// non-whitespace characters (tiktoken issue 195: the regex backtracks badly on longer runs).
inline constexpr size_t kMaxSliceChars = 400'000;
inline constexpr size_t kMaxRunChars = 25'000;

// Replaces every ill-formed subsequence of `text` by U+FFFD, one per maximal subpart, as the
// WHATWG/Unicode decoders do (JavaScript's TextDecoder, Python's errors="replace"). Returns
// false and leaves `out` untouched when `text` is already valid UTF-8, so that the common case
// costs no copy.
bool RepairUtf8(std::string_view text, std::string* out);

// Python's str.isspace(): bidirectional class WS, B or S, or general category Zs. Unlike
// Unicode White_Space it includes U+001C..U+001F; unlike PCRE2's \s it excludes U+180E.
bool IsPythonSpace(char32_t c);

// Appends to `chunks` the pieces the official encode hands to tiktoken, for valid UTF-8 `text`:
// slices of at most `max_slice_chars` code points, each cut where a run of whitespace or
// non-whitespace code points would exceed `max_run_chars`. Characters are code points, as in
// Python. Empty text yields no chunk.
void ChunkText(std::string_view text, size_t max_slice_chars, size_t max_run_chars,
               std::vector<std::string_view>* chunks);

}  // namespace k3::tokenizer_internal
