// The tokenizer on arbitrary bytes: Encode (with and without special tokens) and Decode of
// arbitrary ids, on two generated vocabularies (the unit tests' merges and the one `k3 synth`
// ships). Encode must never fail or produce an id outside the vocabulary, and for valid UTF-8
// decode(encode(x)) == x; Decode must refuse bad ids with a status.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/synth/synth_tokenizer.h"
#include "core/text/tokenizer/tokenizer.h"
#include "tests/tokenizer/test_vocab.h"

namespace {

namespace tt = k3::tokenizer_testing;

// 512 ranks: the byte tokens, the tests' merges, fillers; then named specials in the block.
k3::Tokenizer TestVocabTokenizer() {
  std::vector<std::string> vocab = tt::MakeVocab(tt::TestMerges(), 512);
  std::vector<std::pair<std::string, k3::TokenId>> ranks;
  for (size_t i = 0; i < vocab.size(); ++i) ranks.emplace_back(vocab[i], static_cast<int>(i));
  auto tok = k3::Tokenizer::Create(std::move(ranks), {{512, "[BOS]"},
                                                      {513, "[EOS]"},
                                                      {514, "<|im_end|>"},
                                                      {515, "<|im_user|>"},
                                                      {516, "<|end_of_msg|>"}});
  if (!tok.ok()) std::abort();
  return *std::move(tok);
}

// What `k3 synth` writes for a 4096-token model, read through the file parsers.
k3::Tokenizer SynthTokenizer() {
  auto tok = k3::MakeSynthTokenizerInMemory(4096);
  if (!tok.ok()) std::abort();
  return *std::move(tok);
}

// Well-formed UTF-8 as Unicode defines it: no overlong forms, surrogates or values past
// U+10FFFF.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      n = 1;
      cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      n = 2;
      cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      n = 3;
      cp = b & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const k3::Tokenizer* const kTokenizers[2] = {new k3::Tokenizer(TestVocabTokenizer()),
                                                      new k3::Tokenizer(SynthTokenizer())};
  if (size == 0) return 0;
  // The first byte picks the vocabulary, special-token handling and the mode; the rest is text
  // (or, for Decode, little-endian 32-bit ids).
  const uint8_t mode = data[0];
  const k3::Tokenizer& tok = *kTokenizers[mode & 1];
  const bool allow_special = (mode & 2) != 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  if ((mode & 4) != 0) {
    std::vector<k3::TokenId> ids(text.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), text.data(), ids.size() * 4);
    for (k3::TokenId& id : ids) {
      // Mostly ids near the vocabulary, sometimes anything at all.
      if ((mode & 8) == 0) id = static_cast<k3::TokenId>(static_cast<uint32_t>(id) % 5000);
    }
    auto decoded = tok.Decode(ids);
    bool all_valid = true;
    for (k3::TokenId id : ids) {
      auto bytes = tok.TokenBytes(id);
      all_valid = all_valid && bytes.ok();
      (void)tok.IsSpecial(id);
    }
    if (decoded.ok() != all_valid) std::abort();
    return 0;
  }

  std::vector<k3::TokenId> ids = tok.Encode(text, allow_special);
  if (ids.empty() != text.empty()) std::abort();
  for (k3::TokenId id : ids) {
    if (id < 0 || id >= tok.vocab_size()) std::abort();
  }
  auto decoded = tok.Decode(ids);
  if (!decoded.ok()) std::abort();
  if (IsValidUtf8(text) && *decoded != text) std::abort();
  return 0;
}
