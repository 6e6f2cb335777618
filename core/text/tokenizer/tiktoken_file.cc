#include "core/text/tokenizer/tiktoken_file.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/absl_compat.h"
#include "nlohmann/json.hpp"

namespace k3::tokenizer_internal {
namespace {

constexpr std::array<int8_t, 256> MakeBase64Table() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (size_t i = 0; i < kAlphabet.size(); ++i) {
    table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  }
  return table;
}
constexpr std::array<int8_t, 256> kBase64 = MakeBase64Table();

// Shows a field of a malformed line without flooding the message.
std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out;
  for (char c : text.substr(0, kMax)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  if (text.size() > kMax) out += "...";
  return out;
}

}  // namespace

bool DecodeBase64(std::string_view text, std::string* out) {
  out->clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  size_t padding = 0;
  if (text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  out->reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    uint32_t bits = 0;
    for (size_t k = 0; k < 4; ++k) {
      const bool pad = last && k >= 4 - padding;
      const int v = pad ? 0 : kBase64[static_cast<uint8_t>(text[i + k])];
      if (v < 0) return false;  // includes '=' anywhere but the final padding
      bits = (bits << 6) | static_cast<uint32_t>(v);
    }
    const size_t bytes = last ? 3 - padding : 3;
    // Bits that fall into the padding must be zero, or two spellings would give one token.
    if (bytes < 3 && (bits & ((uint32_t{1} << (8 * (3 - bytes))) - 1)) != 0) return false;
    for (size_t k = 0; k < bytes; ++k) out->push_back(static_cast<char>(bits >> (16 - 8 * k)));
  }
  return true;
}

absl::StatusOr<std::vector<RankedBytes>> ParseTiktokenModel(std::string_view contents,
                                                            std::string_view file_name) {
  std::vector<RankedBytes> entries;
  entries.reserve(contents.size() / 12);
  // Line of first use, to point at both lines of a duplicate.
  absl::flat_hash_map<int64_t, size_t> rank_line;
  absl::flat_hash_map<std::string, size_t> bytes_line;
  rank_line.reserve(contents.size() / 12);
  bytes_line.reserve(contents.size() / 12);

  size_t line_no = 0;
  size_t pos = 0;
  while (pos < contents.size()) {
    size_t eol = contents.find('\n', pos);
    if (eol == std::string_view::npos) eol = contents.size();
    std::string_view line = contents.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;

    const auto error = [&](std::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(Av(file_name), ":", line_no, ": ", Av(what)));
    };
    const size_t space = line.find(' ');
    if (space == std::string_view::npos) {
      return error(absl::StrCat("expected \"<base64> <rank>\", got \"", Excerpt(line), "\""));
    }
    const std::string_view b64 = line.substr(0, space);
    const std::string_view rank_text = line.substr(space + 1);
    if (rank_text.find(' ') != std::string_view::npos) {
      return error(
          absl::StrCat("expected two fields \"<base64> <rank>\", got \"", Excerpt(line), "\""));
    }
    RankedBytes entry;
    if (b64.empty()) return error("empty token (no base64 before the space)");
    if (!DecodeBase64(b64, &entry.bytes)) {
      return error(absl::StrCat("invalid base64 \"", Excerpt(b64), "\""));
    }
    if (rank_text.empty() || rank_text.size() > 10 ||
        !std::all_of(rank_text.begin(), rank_text.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      return error(
          absl::StrCat("rank \"", Excerpt(rank_text), "\" is not a non-negative decimal integer"));
    }
    for (char c : rank_text) entry.rank = entry.rank * 10 + (c - '0');
    if (entry.rank > kMaxRank) {
      return error(absl::StrCat("rank ", entry.rank, " exceeds the limit ", kMaxRank));
    }
    if (const auto [it, fresh] = rank_line.emplace(entry.rank, line_no); !fresh) {
      return error(absl::StrCat("rank ", entry.rank, " already given on line ", it->second));
    }
    if (const auto [it, fresh] = bytes_line.emplace(entry.bytes, line_no); !fresh) {
      return error(absl::StrCat("token \"", Av(b64), "\" already given on line ", it->second));
    }
    entries.push_back(std::move(entry));
  }
  if (entries.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Av(file_name), ": no tokens"));
  }
  return entries;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ParseAddedTokens(
    std::string_view contents, std::string_view file_name) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(contents.begin(), contents.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based and points just past the offending character.
    const size_t offset = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, contents.size());
    const std::string_view before = contents.substr(0, offset);
    const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t line_start = before.rfind('\n');
    const size_t column = offset - (line_start == std::string_view::npos ? 0 : line_start + 1) + 1;
    return absl::InvalidArgumentError(
        absl::StrCat(Av(file_name), ":", line, ":", column, ": invalid JSON: ", e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for any type
    return absl::InvalidArgumentError(absl::StrCat(Av(file_name), ": invalid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(file_name), ": the top level is not an object"));
  }
  std::vector<std::pair<int64_t, std::string>> tokens;
  const auto it = root.find("added_tokens_decoder");
  if (it == root.end()) return tokens;
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Av(file_name), ": added_tokens_decoder is not an object"));
  }
  for (const auto& item : it->items()) {
    // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& key = item.key();
    const auto& value = item.value();
    const auto error = [&](std::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(Av(file_name), ": added_tokens_decoder[\"",
                                                     Excerpt(key), "\"]: ", Av(what)));
    };
    if (key.empty() || key.size() > 9 ||
        !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return error("the key is not a decimal token id");
    }
    const auto content = value.is_object() ? value.find("content") : value.end();
    if (!value.is_object() || content == value.end() || !content->is_string()) {
      return error("no string \"content\"");
    }
    std::string text = content->get<std::string>();
    if (text.empty()) return error("empty \"content\"");
    tokens.emplace_back(std::stoll(key), std::move(text));
  }
  std::sort(tokens.begin(), tokens.end());
  return tokens;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::move(buffer).str();
}

}  // namespace k3::tokenizer_internal
