// The Kimi K3 tokenizer (MODEL.md section 4): tiktoken byte-level BPE over Kimi's pre-tokenizer
// pattern, with the chunking and special-token rules of the official `encode`
// (tokenization_kimi.py). Loads the checkpoint's `tiktoken.model` and `tokenizer_config.json`.
//
//   absl::StatusOr<k3::Tokenizer> tok = k3::Tokenizer::Load(checkpoint_dir);
//   std::vector<k3::TokenId> ids = tok->Encode("Hello", /*allow_special=*/false);
//   absl::StatusOr<std::string> text = tok->Decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

using TokenId = int32_t;

// Kimi's pre-tokenizer pattern (MODEL.md 4.2 step 3), in tiktoken (Rust regex) syntax.
inline constexpr std::string_view kKimiPatStr =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+)"
    R"([\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// Special-token slots after the BPE ranks (MODEL.md 4.3: ids 163584..163839 for K3).
inline constexpr int kNumReservedSpecialTokens = 256;

struct TokenizerOptions {
  // Any tiktoken pattern; Rust regex syntax is translated to PCRE2 (see pretokenizer.h).
  std::string pat_str{kKimiPatStr};
  int num_reserved_special_tokens = kNumReservedSpecialTokens;
};

// Immutable after construction; copies share the tables. All methods are thread-safe.
class Tokenizer {
 public:
  // Reads `dir`/tiktoken.model and `dir`/tokenizer_config.json.
  static absl::StatusOr<Tokenizer> Load(const std::string& dir,
                                        const TokenizerOptions& options = {});
  // As Load, with explicit paths; an empty `config_path` means no named special tokens.
  static absl::StatusOr<Tokenizer> LoadFiles(const std::string& model_path,
                                             const std::string& config_path,
                                             const TokenizerOptions& options = {});

  // Builds from memory. `ranks`: token bytes and rank (= id), as in tiktoken.model; every
  // single byte must have a rank. `added_tokens`: id and content, as in added_tokens_decoder.
  //
  // Special tokens fill the num_reserved_special_tokens slots that follow the highest rank, as
  // the official tokenizer builds them: a slot takes its name from `added_tokens`, or else is
  // `<|reserved_token_{id}|>`. Entries of `added_tokens` outside the slots are ignored, as
  // upstream does. vocab_size() = highest rank + 1 + num_reserved_special_tokens.
  static absl::StatusOr<Tokenizer> Create(std::vector<std::pair<std::string, TokenId>> ranks,
                                          std::vector<std::pair<TokenId, std::string>> added_tokens,
                                          const TokenizerOptions& options = {});

  // Encodes `text` as the official encode does:
  //  1. cut into slices of <= 400,000 code points, each cut where a run of whitespace or
  //     non-whitespace code points (Python isspace) would exceed 25,000;
  //  2. per piece, when `allow_special`, split around special-token strings (leftmost match,
  //     the longest at that position; a special cut by step 1 stays text, as upstream);
  //     otherwise they are ordinary text;
  //  3. split by the pattern; byte-level BPE per piece.
  // Bytes that are not valid UTF-8 are first replaced by U+FFFD, one per maximal ill-formed
  // subsequence (what TextDecoder or Python's errors="replace" yield), so that the ids equal
  // those of the reference tokenizer for the decoded string; decode(encode(x)) == x for valid
  // UTF-8 `x` only. Chat-template data must be encoded with `allow_special` false (MODEL.md 4.2).
  std::vector<TokenId> Encode(std::string_view text, bool allow_special) const;

  // Concatenates the bytes of `ids` (special ids as their literal text). The result may be
  // invalid UTF-8, e.g. when it ends inside a multi-byte character. Fails on an id outside
  // [0, vocab_size()) or an id without bytes (a gap in the ranks).
  absl::StatusOr<std::string> Decode(std::span<const TokenId> ids) const;

  // The bytes of one token, for streaming output.
  absl::StatusOr<std::string_view> TokenBytes(TokenId id) const;

  std::optional<TokenId> SpecialTokenId(std::string_view content) const;
  bool IsSpecial(TokenId id) const;
  // Every special token (named and reserved), in id order.
  std::vector<std::pair<std::string, TokenId>> SpecialTokens() const;

  int vocab_size() const;
  // Number of BPE rank slots (highest rank + 1); special ids start here.
  int num_base_tokens() const;
  // The pattern as compiled by PCRE2, for diagnostics.
  const std::string& pcre2_pattern() const;

 private:
  struct Impl;
  // Create, with the names of the files that `ranks` and `added_tokens` came from (may be
  // empty) prefixed to the errors about them.
  static absl::StatusOr<Tokenizer> Build(std::vector<std::pair<std::string, TokenId>> ranks,
                                         std::vector<std::pair<TokenId, std::string>> added_tokens,
                                         const TokenizerOptions& options,
                                         std::string_view ranks_source,
                                         std::string_view added_source);
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace k3
