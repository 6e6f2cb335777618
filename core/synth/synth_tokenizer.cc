#include "core/synth/synth_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/text/tokenizer/tiktoken_file.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

// Text the merges are learned from: English prose, code, numbers and a little CJK, so that the
// vocabulary has realistic multi-byte tokens.
constexpr char kTrainingText[] = R"(The capital of France is Paris. It is known for the Eiffel
Tower, the Louvre, and its cafes. Streaming the experts from disk means that only the sixteen
experts a token routes to are read, so the machine never needs to hold the whole model in
memory. When the cache holds an expert, the read is skipped; when it does not, the engine
reads it with a queue of requests that keeps the device busy. A mixture of experts routes each
token through a small subset of its parameters, and the router picks them from the hidden state.
The quick brown fox jumps over the lazy dog. She said that they would be there at nine o'clock,
and we'll see whether they're right. I've heard it's going to rain; don't forget your umbrella.
Once upon a time there was a little model that wanted to run on a laptop. It learned to read
its weights from the disk just in time, and everyone was happy with the speed it reached.
int main(int argc, char** argv) { for (int i = 0; i < argc; ++i) printf("%s\n", argv[i]); }
def forward(self, x): return self.down(self.act(self.gate(x)) * self.up(x))
{"name": "k3", "layers": 93, "experts": 896, "active": 16, "hidden": 7168}
1234567890 2026 3.14159 100 200 300 1000000 42 7 12 24 48 96 192 384 768 1536 3072
中文测试：你好世界。模型从磁盘读取专家。 日本語のテキスト。 한국어 문장입니다.
Emoji and symbols: naive cafe resume -> => <= != == && || :: ... --- *** ### @@@)";

using Token = std::string;

// Splits like a GPT-style pre-tokenizer: an optional space, then a run of letters, digits or
// other non-space bytes; UTF-8 continuation bytes stay with their lead byte.
std::vector<std::string> PreTokenize(std::string_view text) {
  std::vector<std::string> words;
  size_t i = 0;
  auto cls = [](unsigned char c) {
    if (c >= 0x80 || std::isalpha(c)) return 0;
    if (std::isdigit(c)) return 1;
    if (std::isspace(c)) return 2;
    return 3;
  };
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && cls(text[i + 1]) != 2) ++i;
    int kind = cls(static_cast<unsigned char>(text[i]));
    while (i < text.size() && cls(static_cast<unsigned char>(text[i])) == kind) ++i;
    words.emplace_back(text.substr(start, i - start));
  }
  return words;
}

// Byte-pair merges learned greedily: most frequent adjacent pair first, ties to the smaller
// byte string, so the result depends on nothing but the text.
std::vector<Token> LearnMerges(size_t max_merges) {
  std::map<std::string, int> word_counts;
  for (std::string& w : PreTokenize(kTrainingText)) ++word_counts[w];
  std::vector<std::pair<std::vector<Token>, int>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<Token> symbols;
    for (char c : w) symbols.emplace_back(1, c);
    words.emplace_back(std::move(symbols), n);
  }
  std::vector<Token> merges;
  std::set<Token> known;
  while (merges.size() < max_merges) {
    std::map<std::pair<Token, Token>, int> pairs;
    for (const auto& [symbols, n] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += n;
    }
    if (pairs.empty()) break;
    auto best = std::max_element(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) {
      if (a.second != b.second) return a.second < b.second;
      return a.first.first + a.first.second > b.first.first + b.first.second;
    });
    const auto [left, right] = best->first;
    for (auto& [symbols, n] : words) {
      std::vector<Token> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          merged.push_back(left + right);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
    if (known.insert(left + right).second) merges.push_back(left + right);
  }
  return merges;
}

// Special-token names of the K3 reserved block, by offset from its first id (MODEL.md 4.3).
const std::map<int, std::string>& SpecialNames() {
  static const std::map<int, std::string> kNames = {{0, "[BOS]"},
                                                    {1, "[EOS]"},
                                                    {2, "<|end_of_msg|>"},
                                                    {3, "<|open|>"},
                                                    {4, "<|close|>"},
                                                    {5, "<|sep|>"},
                                                    {6, "[start_header_id]"},
                                                    {7, "[end_header_id]"},
                                                    {9, "[EOT]"},
                                                    {18, "<|media_begin|>"},
                                                    {19, "<|media_content|>"},
                                                    {20, "<|media_end|>"},
                                                    {21, "<|media_pad|>"},
                                                    {65, "<osagent_mode>"},
                                                    {254, "[UNK]"},
                                                    {255, "[PAD]"}};
  return kNames;
}

}  // namespace

SynthTokenizerFiles MakeSynthTokenizer(int64_t vocab_size) {
  SynthTokenizerFiles out;
  const bool specials = vocab_size >= 512;
  out.num_ranks = specials ? vocab_size - 256 : std::min<int64_t>(vocab_size, 256);
  std::vector<Token> ranks;
  for (int b = 0; b < 256 && static_cast<int64_t>(ranks.size()) < out.num_ranks; ++b) {
    ranks.emplace_back(1, static_cast<char>(b));
  }
  std::set<Token> present(ranks.begin(), ranks.end());
  const size_t want = static_cast<size_t>(out.num_ranks);
  for (Token& t : LearnMerges(want - ranks.size())) {
    if (present.insert(t).second) ranks.push_back(std::move(t));
  }
  // Fill what the text could not teach with printable two-byte pairs (each is one merge of
  // two byte tokens, so every rank stays reachable), then, for vocabularies as large as the
  // release's (163,584 ranks), printable triples (each a pair plus a byte, the pair ranked
  // before it).
  for (int a = 32; a < 127 && ranks.size() < want; ++a) {
    for (int b = 32; b < 127 && ranks.size() < want; ++b) {
      Token t{static_cast<char>(a), static_cast<char>(b)};
      if (present.insert(t).second) ranks.push_back(std::move(t));
    }
  }
  for (int a = 32; a < 127 && ranks.size() < want; ++a) {
    for (int b = 32; b < 127 && ranks.size() < want; ++b) {
      for (int c = 32; c < 127 && ranks.size() < want; ++c) {
        Token t{static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)};
        if (present.insert(t).second) ranks.push_back(std::move(t));
      }
    }
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StrAppend(&out.tiktoken_model, absl::Base64Escape(ranks[r]), " ", r, "\n");
  }

  nlohmann::ordered_json decoder = nlohmann::ordered_json::object();
  if (specials) {
    const int64_t base = vocab_size - 256;
    for (int i = 0; i < 256; ++i) {
      auto it = SpecialNames().find(i);
      std::string name = it != SpecialNames().end()
                             ? it->second
                             : absl::StrCat("<|reserved_token_", base + i, "|>");
      decoder[absl::StrCat(base + i)] = {{"content", name},      {"lstrip", false},
                                         {"normalized", false},  {"rstrip", false},
                                         {"single_word", false}, {"special", true}};
    }
    out.bos_id = base;
    out.eos_id = base + 2;
  }
  nlohmann::ordered_json config = {{"added_tokens_decoder", decoder},
                                   {"tokenizer_class", "TikTokenTokenizer"},
                                   {"model_max_length", 1048576}};
  if (specials) {
    config["bos_token"] = "[BOS]";
    config["eos_token"] = "<|end_of_msg|>";
    config["pad_token"] = "[PAD]";
    config["unk_token"] = "[UNK]";
  }
  out.tokenizer_config_json = config.dump(2) + "\n";
  return out;
}

absl::StatusOr<Tokenizer> MakeSynthTokenizerInMemory(int64_t vocab_size) {
  const SynthTokenizerFiles files = MakeSynthTokenizer(vocab_size);
  auto ranked = tokenizer_internal::ParseTiktokenModel(files.tiktoken_model, "tiktoken.model");
  if (!ranked.ok()) return ranked.status();
  auto added =
      tokenizer_internal::ParseAddedTokens(files.tokenizer_config_json, "tokenizer_config.json");
  if (!added.ok()) return added.status();
  std::vector<std::pair<std::string, TokenId>> ranks;
  for (auto& r : *ranked) ranks.emplace_back(std::move(r.bytes), static_cast<TokenId>(r.rank));
  std::vector<std::pair<TokenId, std::string>> specials;
  for (auto& [id, text] : *added) specials.emplace_back(static_cast<TokenId>(id), std::move(text));
  return Tokenizer::Create(std::move(ranks), std::move(specials));
}

}  // namespace k3
