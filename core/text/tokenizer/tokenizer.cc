#include "core/text/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/absl_compat.h"
#include "core/text/tokenizer/bpe.h"
#include "core/text/tokenizer/pretokenizer.h"
#include "core/text/tokenizer/tiktoken_file.h"
#include "core/text/tokenizer/unicode.h"

namespace k3 {
namespace {

using tokenizer_internal::Av;
using tokenizer_internal::kNoRank;
using tokenizer_internal::Rank;

// Finds special-token strings: the leftmost occurrence, the longest one at that position. A byte
// trie: the ~256 K3 specials share long prefixes ("<|reserved_token_"), so comparing each of them
// at every '<' of an HTML or code text would be slow.
class SpecialMatcher {
 public:
  SpecialMatcher() : nodes_(1) { starts_.fill(false); }

  void Add(std::string_view content, TokenId id) {
    uint32_t node = 0;
    for (char c : content) node = ChildOrNew(node, static_cast<uint8_t>(c));
    nodes_[node].id = id;
    starts_[static_cast<uint8_t>(content[0])] = true;
  }

  struct Match {
    size_t start;
    size_t length;
    TokenId id;
  };
  // The first special at or after `from` in `text`, if any.
  std::optional<Match> Find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!starts_[static_cast<uint8_t>(text[i])]) continue;
      std::optional<Match> best;
      uint32_t node = 0;
      for (size_t j = i; j < text.size(); ++j) {
        node = Child(node, static_cast<uint8_t>(text[j]));
        if (node == kNone) break;
        if (nodes_[node].id >= 0) best = Match{i, j + 1 - i, nodes_[node].id};
      }
      if (best) return best;
    }
    return std::nullopt;
  }

 private:
  static constexpr uint32_t kNone = 0;  // the root is nobody's child

  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    TokenId id = -1;
  };

  uint32_t Child(uint32_t node, uint8_t byte) const {
    for (const auto& [b, child] : nodes_[node].children) {
      if (b == byte) return child;
    }
    return kNone;
  }
  uint32_t ChildOrNew(uint32_t node, uint8_t byte) {
    if (const uint32_t found = Child(node, byte); found != kNone) return found;
    nodes_.emplace_back();
    const auto child = static_cast<uint32_t>(nodes_.size() - 1);
    nodes_[node].children.emplace_back(byte, child);
    return child;
  }

  std::vector<Node> nodes_;
  std::array<bool, 256> starts_;
};

enum class Kind : uint8_t { kNone, kOrdinary, kSpecial };

}  // namespace

struct Tokenizer::Impl {
  explicit Impl(tokenizer_internal::PreTokenizer p) : pretokenizer(std::move(p)) {}

  // Appends the ids of one piece of text that holds no special token.
  void EncodeOrdinary(std::string_view text, std::vector<std::string_view>* pieces,
                      std::vector<TokenId>* ids) const {
    pieces->clear();
    pretokenizer.Split(text, pieces);
    for (std::string_view piece : *pieces) {
      // A piece that is itself a token is taken whole, as tiktoken does, before any merging.
      const Rank whole = ranks.Find(piece);
      if (whole != kNoRank) {
        ids->push_back(static_cast<TokenId>(whole));
      } else {
        tokenizer_internal::BytePairEncode(piece, ranks, ids);
      }
    }
  }

  tokenizer_internal::PreTokenizer pretokenizer;
  tokenizer_internal::RankTable ranks;  // views into `bytes`
  std::vector<std::string> bytes;       // by id: token bytes, or a special's text
  std::vector<Kind> kind;               // by id
  absl::flat_hash_map<std::string, TokenId> special_ids;
  SpecialMatcher specials;
  int num_base = 0;
};

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir, const TokenizerOptions& options) {
  return LoadFiles(dir + "/tiktoken.model", dir + "/tokenizer_config.json", options);
}

absl::StatusOr<Tokenizer> Tokenizer::LoadFiles(const std::string& model_path,
                                               const std::string& config_path,
                                               const TokenizerOptions& options) {
  absl::StatusOr<std::string> model_text = tokenizer_internal::ReadWholeFile(model_path);
  if (!model_text.ok()) return model_text.status();
  absl::StatusOr<std::vector<tokenizer_internal::RankedBytes>> parsed =
      tokenizer_internal::ParseTiktokenModel(*model_text, model_path);
  if (!parsed.ok()) return parsed.status();
  model_text->clear();
  model_text->shrink_to_fit();

  std::vector<std::pair<TokenId, std::string>> added;
  if (!config_path.empty()) {
    absl::StatusOr<std::string> config_text = tokenizer_internal::ReadWholeFile(config_path);
    if (!config_text.ok()) return config_text.status();
    absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> tokens =
        tokenizer_internal::ParseAddedTokens(*config_text, config_path);
    if (!tokens.ok()) return tokens.status();
    for (auto& [id, content] : *tokens) {
      // Ids beyond any vocabulary cannot name a slot; Create ignores them like others outside.
      if (id <= tokenizer_internal::kMaxRank + options.num_reserved_special_tokens + 1) {
        added.emplace_back(static_cast<TokenId>(id), std::move(content));
      }
    }
  }

  std::vector<std::pair<std::string, TokenId>> ranks;
  ranks.reserve(parsed->size());
  for (auto& entry : *parsed) {
    ranks.emplace_back(std::move(entry.bytes), static_cast<TokenId>(entry.rank));
  }
  parsed->clear();
  return Build(std::move(ranks), std::move(added), options, model_path, config_path);
}

absl::StatusOr<Tokenizer> Tokenizer::Create(
    std::vector<std::pair<std::string, TokenId>> ranks,
    std::vector<std::pair<TokenId, std::string>> added_tokens, const TokenizerOptions& options) {
  return Build(std::move(ranks), std::move(added_tokens), options, "", "");
}

absl::StatusOr<Tokenizer> Tokenizer::Build(
    std::vector<std::pair<std::string, TokenId>> ranks,
    std::vector<std::pair<TokenId, std::string>> added_tokens, const TokenizerOptions& options,
    std::string_view ranks_source, std::string_view added_source) {
  const auto ranks_error = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        ranks_source.empty() ? std::string(what) : absl::StrCat(Av(ranks_source), ": ", Av(what)));
  };
  const auto added_error = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        added_source.empty() ? std::string(what) : absl::StrCat(Av(added_source), ": ", Av(what)));
  };
  if (ranks.empty()) return ranks_error("the vocabulary has no tokens");
  if (options.num_reserved_special_tokens < 0 || options.num_reserved_special_tokens > 65536) {
    return absl::InvalidArgumentError("num_reserved_special_tokens must be in [0, 65536]");
  }
  absl::StatusOr<tokenizer_internal::PreTokenizer> pretokenizer =
      tokenizer_internal::PreTokenizer::Create(options.pat_str);
  if (!pretokenizer.ok()) return pretokenizer.status();
  auto impl = std::make_shared<Impl>(*std::move(pretokenizer));

  TokenId max_rank = 0;
  for (const auto& [bytes, rank] : ranks) {
    if (rank < 0 || rank > tokenizer_internal::kMaxRank) {
      return ranks_error(
          absl::StrCat("rank ", rank, " is outside [0, ", tokenizer_internal::kMaxRank, "]"));
    }
    if (bytes.empty()) return ranks_error(absl::StrCat("rank ", rank, " is empty"));
    max_rank = std::max(max_rank, rank);
  }
  impl->num_base = max_rank + 1;
  const int vocab_size = impl->num_base + options.num_reserved_special_tokens;
  impl->bytes.resize(vocab_size);
  impl->kind.assign(vocab_size, Kind::kNone);

  // The table keeps views into impl->bytes, which is never resized after this point.
  impl->ranks.Reserve(ranks.size());
  for (auto& [bytes, rank] : ranks) {
    if (impl->kind[rank] != Kind::kNone) {
      return ranks_error(absl::StrCat("rank ", rank, " is given twice"));
    }
    impl->bytes[rank] = std::move(bytes);
    impl->kind[rank] = Kind::kOrdinary;
    if (!impl->ranks.Insert(impl->bytes[rank], static_cast<Rank>(rank))) {
      return ranks_error(absl::StrCat("ranks ", impl->ranks.Find(impl->bytes[rank]), " and ", rank,
                                      " have the same bytes"));
    }
  }
  ranks.clear();
  // Byte-level BPE can encode anything only if every byte is a token.
  for (int b = 0; b < 256; ++b) {
    if (impl->ranks.Find(std::string(1, static_cast<char>(b))) == kNoRank) {
      return ranks_error(absl::StrFormat("no token for the byte 0x%02X", b));
    }
  }

  for (auto& [id, content] : added_tokens) {
    if (id < impl->num_base || id >= vocab_size) continue;
    if (content.empty()) {
      return added_error(absl::StrCat("special token ", id, " is empty"));
    }
    if (impl->kind[id] == Kind::kSpecial) {
      return added_error(absl::StrCat("special token ", id, " is named twice"));
    }
    impl->bytes[id] = std::move(content);
    impl->kind[id] = Kind::kSpecial;
  }
  for (TokenId id = impl->num_base; id < vocab_size; ++id) {
    if (impl->kind[id] != Kind::kSpecial) {
      impl->bytes[id] = absl::StrCat("<|reserved_token_", id, "|>");
      impl->kind[id] = Kind::kSpecial;
    }
    const auto [it, fresh] = impl->special_ids.emplace(impl->bytes[id], id);
    if (!fresh) {
      return added_error(absl::StrCat("special tokens ", it->second, " and ", id, " are both \"",
                                      impl->bytes[id], "\""));
    }
    impl->specials.Add(impl->bytes[id], id);
  }
  return Tokenizer(std::move(impl));
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::string repaired;
  if (tokenizer_internal::RepairUtf8(text, &repaired)) text = repaired;

  std::vector<std::string_view> chunks;
  tokenizer_internal::ChunkText(text, tokenizer_internal::kMaxSliceChars,
                                tokenizer_internal::kMaxRunChars, &chunks);
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 4);
  std::vector<std::string_view> pieces;
  for (std::string_view chunk : chunks) {
    size_t pos = 0;
    if (allow_special) {
      while (const std::optional<SpecialMatcher::Match> m = impl_->specials.Find(chunk, pos)) {
        impl_->EncodeOrdinary(chunk.substr(pos, m->start - pos), &pieces, &ids);
        ids.push_back(m->id);
        pos = m->start + m->length;
      }
    }
    impl_->EncodeOrdinary(chunk.substr(pos), &pieces, &ids);
  }
  return ids;
}

absl::StatusOr<std::string_view> Tokenizer::TokenBytes(TokenId id) const {
  if (id < 0 || id >= vocab_size()) {
    return absl::OutOfRangeError(
        absl::StrCat("token id ", id, " is outside [0, ", vocab_size(), ")"));
  }
  if (impl_->kind[id] == Kind::kNone) {
    return absl::NotFoundError(absl::StrCat("token id ", id, " has no bytes (a gap in the ranks)"));
  }
  return std::string_view(impl_->bytes[id]);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) {
    absl::StatusOr<std::string_view> bytes = TokenBytes(id);
    if (!bytes.ok()) return bytes.status();
    out += *bytes;
  }
  return out;
}

std::optional<TokenId> Tokenizer::SpecialTokenId(std::string_view content) const {
  const auto it = impl_->special_ids.find(std::string(content));
  if (it == impl_->special_ids.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(TokenId id) const {
  return id >= 0 && id < vocab_size() && impl_->kind[id] == Kind::kSpecial;
}

std::vector<std::pair<std::string, TokenId>> Tokenizer::SpecialTokens() const {
  std::vector<std::pair<std::string, TokenId>> out;
  for (TokenId id = impl_->num_base; id < vocab_size(); ++id)
    out.emplace_back(impl_->bytes[id], id);
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->bytes.size()); }
int Tokenizer::num_base_tokens() const { return impl_->num_base; }
const std::string& Tokenizer::pcre2_pattern() const { return impl_->pretokenizer.pcre2_pattern(); }

}  // namespace k3
