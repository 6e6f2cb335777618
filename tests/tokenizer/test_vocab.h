// Generated vocabularies in the formats of a Kimi checkpoint (tiktoken.model and
// tokenizer_config.json), for tests and benchmarks: no real vocabulary may be downloaded.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tests/util/sanitizers.h"

namespace k3::tokenizer_testing {

// Kimi's layout: 163,584 BPE ranks, then 256 special-token slots.
inline constexpr int kKimiNumBase = 163584;

std::string Base64Encode(std::string_view bytes);

// The UTF-8 encoding of one code point.
std::string Utf8(char32_t c);

// Token bytes by rank: the 256 single bytes at ranks 0..255, then `merges` from rank 256, then
// filler tokens up to `num_base` ranks. Fillers contain bytes that never occur in UTF-8, so no
// text ever produces them.
std::vector<std::string> MakeVocab(const std::vector<std::string>& merges, int num_base);

// The merges of the unit tests' vocabulary. "  " (two spaces) is first, so that it gets rank
// 256 as in Kimi's vocabulary (MODEL.md 4.4: "  <|end_of_msg|>  " -> 256, 163586, 256).
std::vector<std::string> TestMerges();

// tiktoken.model text: one "<base64> <rank>" line per token, rank = index.
std::string TiktokenModelText(const std::vector<std::string>& tokens);

// The named K3 special tokens of MODEL.md 4.3.
std::vector<std::pair<int, std::string>> K3SpecialTokens();

// tokenizer_config.json text with the given added_tokens_decoder entries.
std::string TokenizerConfigText(const std::vector<std::pair<int, std::string>>& added);

// Learns `num_merges` byte-level BPE merges from `pieces` (pre-tokenized text), most frequent
// pair first: a realistic vocabulary for benchmarks.
std::vector<std::string> TrainMerges(const std::vector<std::string>& pieces, int num_merges);

void WriteFile(const std::filesystem::path& path, std::string_view contents);

// Time limits of the speed tests hold for optimised builds; sanitizer and unoptimised builds get
// this much more.
inline double SlowBuildFactor() {
#if !defined(__OPTIMIZE__)
  return 20.0;
#else
  return k3::testing::kSanitized ? 20.0 : 1.0;
#endif
}

// A fresh directory under the system temporary directory, removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace k3::tokenizer_testing
