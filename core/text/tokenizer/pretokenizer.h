// The regex pre-tokenizer (MODEL.md 4.2 step 3). Patterns are written in the syntax tiktoken
// uses (Rust regex / fancy-regex, e.g. Kimi's pat_str with `&&` class intersection) and are
// translated to PCRE2 (UTF, UCP, JIT) so that they match the same pieces.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace k3::tokenizer_internal {

// Translates a tiktoken (Rust regex syntax) pattern into an equivalent PCRE2 pattern:
//  * \s and \S become explicit Unicode White_Space classes (PCRE2's \s also matches U+180E);
//  * \d, \D become \p{Nd}, \P{Nd}, as in Rust;
//  * \p{Name} for a script becomes \p{sc:Name} (bare script names mean Script in Rust but
//    Script_Extensions in PCRE2, which would pull U+3002 "。" into \p{Han});
//  * a class with `&&` or nested classes is rewritten into one PCRE2 class where possible: an
//    intersection A && B is the complement of (not A or not B), and the complement of a union
//    of general categories is the union of the other categories. So
//    [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]] becomes
//    [^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]: a single class keeps `*` and `+` cheap and
//    stack-free under JIT. Other intersections fall back to lookaheads.
// Constructs with different Unicode meanings in the two engines (\w, \W, \b, \B) and class
// difference (--, ~~) are refused.
absl::StatusOr<std::string> TranslatePattern(std::string_view pat_str);

class PreTokenizer {
 public:
  // Compiles `pat_str` (tiktoken syntax) after TranslatePattern.
  static absl::StatusOr<PreTokenizer> Create(std::string_view pat_str);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends to `pieces` the successive leftmost matches in `text`, which must be valid UTF-8.
  // Like tiktoken's find_iter, text that no alternative matches is skipped (Kimi's and the
  // OpenAI patterns match every character). Should the regex engine give up (a resource limit;
  // impossible for these patterns on chunked input), the rest of `text` becomes one piece, so
  // that no text is ever lost. Thread-safe.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

  const std::string& pcre2_pattern() const;

 private:
  struct Compiled;
  explicit PreTokenizer(std::unique_ptr<Compiled> compiled);
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace k3::tokenizer_internal
