#include "tests/tokenizer/test_vocab.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <unordered_map>

#include "nlohmann/json.hpp"

namespace k3::tokenizer_testing {

std::string Base64Encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

std::vector<std::string> MakeVocab(const std::vector<std::string>& merges, int num_base) {
  std::vector<std::string> tokens;
  tokens.reserve(std::max<size_t>(num_base, 256 + merges.size()));
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (const std::string& m : merges) tokens.push_back(m);
  for (uint32_t i = 0; tokens.size() < static_cast<size_t>(num_base); ++i) {
    // 0xF8..0xFF never occur in UTF-8.
    tokens.push_back(
        {static_cast<char>(0xF8 + (i >> 16)), static_cast<char>(i >> 8), static_cast<char>(i)});
  }
  return tokens;
}

std::vector<std::string> TestMerges() {
  return {"  ", "he",     "ll",   "hell",     "hello",    " w",    "or", " wor",
          "ld", " world", "\n\n", "\n\n\n",   "Hel",      "Hello", "12", "123",
          "ab", "ba",     "dc",   "\xE4\xB8", "\xE6\x96", "中",    "文", "中文",
          " t", "th",     " th",  " the",     "in",       "ing",   "er"};
}

std::string TiktokenModelText(const std::vector<std::string>& tokens) {
  std::string out;
  for (size_t rank = 0; rank < tokens.size(); ++rank) {
    out += Base64Encode(tokens[rank]);
    out += ' ';
    out += std::to_string(rank);
    out += '\n';
  }
  return out;
}

std::vector<std::pair<int, std::string>> K3SpecialTokens() {
  return {{163584, "[BOS]"},
          {163585, "[EOS]"},
          {163586, "<|end_of_msg|>"},
          {163587, "<|open|>"},
          {163588, "<|close|>"},
          {163589, "<|sep|>"},
          {163590, "[start_header_id]"},
          {163591, "[end_header_id]"},
          {163593, "[EOT]"},
          {163602, "<|media_begin|>"},
          {163603, "<|media_content|>"},
          {163604, "<|media_end|>"},
          {163605, "<|media_pad|>"},
          {163649, "<osagent_mode>"},
          {163838, "[UNK]"},
          {163839, "[PAD]"}};
}

std::string TokenizerConfigText(const std::vector<std::pair<int, std::string>>& added) {
  nlohmann::json decoder = nlohmann::json::object();
  for (const auto& [id, content] : added) {
    decoder[std::to_string(id)] = {{"content", content},   {"lstrip", false},
                                   {"normalized", false},  {"rstrip", false},
                                   {"single_word", false}, {"special", true}};
  }
  nlohmann::json root = {{"added_tokens_decoder", decoder},
                         {"tokenizer_class", "TikTokenTokenizer"}};
  return root.dump(2);
}

std::vector<std::string> TrainMerges(const std::vector<std::string>& pieces, int num_merges) {
  // Distinct words as symbol-id sequences with their counts; pairs are recounted after every
  // merge, which is fast enough at benchmark sizes.
  std::unordered_map<std::string, int64_t> word_counts;
  for (const std::string& p : pieces) ++word_counts[p];
  std::vector<std::string> symbols;  // by symbol id
  std::unordered_map<std::string, uint32_t> symbol_ids;
  for (int b = 0; b < 256; ++b) {
    symbols.emplace_back(1, static_cast<char>(b));
    symbol_ids.emplace(symbols.back(), b);
  }
  std::vector<std::pair<std::vector<uint32_t>, int64_t>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<uint32_t> s;
    for (char c : w) s.push_back(static_cast<uint8_t>(c));
    if (s.size() > 1) words.emplace_back(std::move(s), n);
  }
  std::vector<std::string> merges;
  std::unordered_map<uint64_t, int64_t> pairs;
  for (int m = 0; m < num_merges; ++m) {
    pairs.clear();
    for (const auto& [s, n] : words) {
      for (size_t i = 0; i + 1 < s.size(); ++i) pairs[(uint64_t{s[i]} << 32) | s[i + 1]] += n;
    }
    if (pairs.empty()) break;
    // Highest count; ties to the smallest key, so that training is deterministic.
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second || (it->second == best->second && it->first < best->first)) {
        best = it;
      }
    }
    const auto left = static_cast<uint32_t>(best->first >> 32);
    const auto right = static_cast<uint32_t>(best->first);
    // Two merges can spell the same bytes ("ab"+"c", "a"+"bc"): one token for both.
    std::string bytes = symbols[left] + symbols[right];
    const auto [found, fresh] = symbol_ids.emplace(bytes, static_cast<uint32_t>(symbols.size()));
    const uint32_t joined = found->second;
    if (fresh) {
      symbols.push_back(bytes);
      merges.push_back(std::move(bytes));
    }
    for (auto& [s, n] : words) {
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          s[out++] = joined;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
    }
  }
  return merges;
}

void WriteFile(const std::filesystem::path& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "k3-tokenizer-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace k3::tokenizer_testing
