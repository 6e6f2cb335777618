// The tokenizer's file parsers on damaged files: tiktoken.model and tokenizer_config.json (the
// two parts of the input, cut at fuzz_util.h's separator), then building a tokenizer from
// what they accept. Bad files must come back as a status naming the file.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "core/text/tokenizer/tiktoken_file.h"
#include "core/text/tokenizer/tokenizer.h"
#include "fuzz/fuzz_util.h"

namespace {

// The decode table is indexed by rank: ranks up to kMaxRank are legal but cost a large table
// per input, which would leave the fuzzer no time for anything else.
constexpr int64_t kMaxFuzzedRank = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts =
      k3::fuzzing::SplitParts(std::string_view(reinterpret_cast<const char*>(data), size), 2);
  auto ranked = k3::tokenizer_internal::ParseTiktokenModel(parts[0], "tiktoken.model");
  auto added = k3::tokenizer_internal::ParseAddedTokens(parts[1], "tokenizer_config.json");
  if (!ranked.ok() && ranked.status().message().find("tiktoken.model") == std::string::npos) {
    std::abort();
  }
  if (!added.ok() && added.status().message().find("tokenizer_config.json") == std::string::npos) {
    std::abort();
  }
  if (!ranked.ok() || !added.ok()) return 0;
  std::vector<std::pair<std::string, k3::TokenId>> ranks;
  for (auto& r : *ranked) {
    if (r.rank > kMaxFuzzedRank) return 0;
    ranks.emplace_back(std::move(r.bytes), static_cast<k3::TokenId>(r.rank));
  }
  std::vector<std::pair<k3::TokenId, std::string>> specials;
  for (auto& [id, text] : *added) {
    if (id > kMaxFuzzedRank + k3::kNumReservedSpecialTokens) continue;
    specials.emplace_back(static_cast<k3::TokenId>(id), std::move(text));
  }
  auto tok = k3::Tokenizer::Create(std::move(ranks), std::move(specials));
  if (!tok.ok()) return 0;
  // A tokenizer that was built must work on its own specials and on plain text.
  for (const auto& [name, id] : tok->SpecialTokens()) {
    auto text = tok->Decode(std::vector<k3::TokenId>{id});
    if (!text.ok() || *text != name) std::abort();
  }
  std::vector<k3::TokenId> ids = tok->Encode("Hello, world! 123 <|im_end|>", true);
  if (!tok->Decode(ids).ok()) std::abort();
  return 0;
}
