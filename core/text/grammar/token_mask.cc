#include "core/text/grammar/token_mask.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/text/grammar/output_grammar.h"

namespace k3::grammar {
namespace {

constexpr float kOff = -std::numeric_limits<float>::infinity();
constexpr const char* kSpecialNames[] = {"<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"};

bool Bit(const std::vector<uint64_t>& bits, int32_t id) { return (bits[id >> 6] >> (id & 63)) & 1; }
void SetBit(std::vector<uint64_t>& bits, int32_t id) { bits[id >> 6] |= uint64_t{1} << (id & 63); }

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenTrie>> TokenTrie::Build(const Tokenizer& tokenizer) {
  auto trie = std::make_shared<TokenTrie>();
  const int vocab = tokenizer.vocab_size();
  trie->symbol_.assign(vocab, kNever);
  trie->offset_.assign(vocab + 1, 0);
  for (int s = 0; s < 4; ++s) {
    const std::optional<TokenId> id = tokenizer.SpecialTokenId(kSpecialNames[s]);
    if (!id) {
      return absl::FailedPreconditionError(
          absl::StrCat("the tokenizer has no ", kSpecialNames[s], " token"));
    }
    trie->special_ids_[s] = *id;
  }
  std::vector<std::pair<std::string_view, int32_t>> sorted;
  for (int32_t id = 0; id < vocab; ++id) {
    trie->offset_[id] = static_cast<uint32_t>(trie->pool_.size());
    if (tokenizer.IsSpecial(id)) continue;
    const absl::StatusOr<std::string_view> bytes = tokenizer.TokenBytes(id);
    if (!bytes.ok() || bytes->empty()) continue;  // a gap in the ranks
    trie->symbol_[id] = kOrdinary;
    trie->pool_.append(*bytes);
  }
  trie->offset_[vocab] = static_cast<uint32_t>(trie->pool_.size());
  for (int s = 0; s < 4; ++s) trie->symbol_[trie->special_ids_[s]] = static_cast<int16_t>(256 + s);
  for (int32_t id = 0; id < vocab; ++id) {
    if (trie->symbol_[id] == kOrdinary) {
      sorted.emplace_back(trie->bytes(id), id);
    } else {
      trie->non_ordinary_.push_back(id);
    }
  }
  // Sorted, tokens that share a prefix are neighbours, so the trie comes out in preorder: the
  // path to the last token is kept, cut back to the next token's common prefix, then extended.
  std::sort(sorted.begin(), sorted.end());
  std::vector<Node>& nodes = trie->nodes_;
  nodes.push_back({-1, 0, 0, 0, 0});
  std::vector<int32_t> path = {0};
  std::string_view prev;
  for (const auto& [bytes, id] : sorted) {
    size_t common = 0;
    while (common < prev.size() && common < bytes.size() && prev[common] == bytes[common]) {
      ++common;
    }
    while (path.size() > common + 1) {
      nodes[path.back()].end = static_cast<int32_t>(nodes.size());
      path.pop_back();
    }
    for (size_t i = common; i < bytes.size(); ++i) {
      const int32_t first = static_cast<int32_t>(trie->tokens_.size());
      nodes.push_back({path.back(), 0, first, first, static_cast<uint8_t>(bytes[i])});
      path.push_back(static_cast<int32_t>(nodes.size() - 1));
    }
    // Sorted, equal byte strings (two ids) follow one another: their node's tokens stay
    // contiguous.
    trie->tokens_.push_back(id);
    nodes[path.back()].last_token = static_cast<int32_t>(trie->tokens_.size());
    prev = bytes;
  }
  for (const int32_t node : path) nodes[node].end = static_cast<int32_t>(nodes.size());
  return std::shared_ptr<const TokenTrie>(std::move(trie));
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar,
                                     std::shared_ptr<const TokenTrie> trie)
    : trie_(std::move(trie)), matcher_(std::move(grammar)), state_(matcher_.start()) {}

absl::StatusOr<std::unique_ptr<GrammarConstraint>> GrammarConstraint::ForOutput(
    const OutputSpec& spec, std::shared_ptr<const TokenTrie> trie) {
  absl::StatusOr<Grammar> grammar = BuildOutputGrammar(spec);
  if (!grammar.ok()) return grammar.status();
  return std::make_unique<GrammarConstraint>(std::make_shared<Grammar>(*std::move(grammar)),
                                             std::move(trie));
}

void GrammarConstraint::set_token_budget(int max_tokens) {
  budget_ = max_tokens;
  allowed_.clear();  // their max_after is a budget's only
}

const GrammarConstraint::Allowed& GrammarConstraint::Walk() {
  if (!cache_masks_ || allowed_.size() >= static_cast<size_t>(kMaxCachedMasks)) allowed_.clear();
  if (auto it = allowed_.find(state_); it != allowed_.end()) return it->second;
  Allowed& allowed = allowed_[state_];
  allowed.max_after = WalkWithin(Matcher::kUnreachable, allowed.bits);
  return allowed;
}

int32_t GrammarConstraint::WalkWithin(int32_t limit, std::vector<uint64_t>& bits) {
  bits.assign((trie_->vocab_size() + 63) / 64, 0);
  const std::vector<TokenTrie::Node>& nodes = trie_->nodes();
  const std::vector<int32_t>& tokens = trie_->tokens();
  // The State at each trie node, per thread rather than per request: K3's trie has about a
  // million nodes, and a thread masks one request at a time.
  thread_local std::vector<Matcher::State> node_state;
  node_state.resize(nodes.size());
  node_state[0] = state_;
  int32_t max_after = -1;
  const bool judge = budget_ >= 0;
  for (size_t i = 1; i < nodes.size();) {
    const TokenTrie::Node& n = nodes[i];
    const Matcher::State next = matcher_.Next(node_state[n.parent], n.byte);
    if (next == Matcher::kDead) {
      i = n.end;  // no token through this byte
      continue;
    }
    node_state[i] = next;
    // A prefix that does not fit may still lead to a token that does (a closing quote further
    // on), so only the tokens are judged, never the subtree.
    if (n.first_token < n.last_token) {
      const int32_t after = judge ? matcher_.MinCompletion(next) : -1;
      if (after <= limit) {
        max_after = std::max(max_after, after);
        for (int32_t t = n.first_token; t < n.last_token; ++t) SetBit(bits, tokens[t]);
      }
    }
    ++i;
  }
  for (int s = kEndOfMsg; s < kNumSymbols; ++s) {
    const Matcher::State next = matcher_.Next(state_, s);
    if (next == Matcher::kDead) continue;
    const int32_t after = judge ? matcher_.MinCompletion(next) : -1;
    if (after <= limit) {
      max_after = std::max(max_after, after);
      SetBit(bits, trie_->special_id(s));
    }
  }
  return max_after;
}

int32_t GrammarConstraint::SpecialAfter(int symbol) {
  const Matcher::State next = matcher_.Next(state_, symbol);
  return next == Matcher::kDead ? -1 : matcher_.MinCompletion(next);
}

void GrammarConstraint::MaskBits(const std::vector<uint64_t>& bits, std::span<float> logits) {
  const int32_t end = trie_->special_id(kEndOfMsg);
  bool any = false;
  for (const uint64_t word : bits) any |= word != 0;
  const int vocab = std::min<int>(trie_->vocab_size(), static_cast<int>(logits.size()));
  for (int32_t id = 0; id < vocab; ++id) {
    if (!Bit(bits, id) && (any || id != end)) logits[id] = kOff;
  }
}

void GrammarConstraint::Mask(std::span<float> logits) {
  if (failed_) return;
  // Ids past the tokenizer's (a model's padded rows) are no token at all.
  for (size_t id = trie_->vocab_size(); id < logits.size(); ++id) logits[id] = kOff;
  // With a budget the turn can still meet, a token must leave it completable (limit: the
  // tokens left after it). Where every allowed token does, the mask is the grammar's alone.
  const int remaining = remaining_tokens();
  const int32_t limit = remaining - 1;
  const bool budgeted = budget_ >= 0 && remaining >= matcher_.MinCompletion(state_);
  if (matcher_.FreeText(state_)) {
    if (budgeted && FreeTextMaxAfter() > limit && MaskFreeTextWithin(limit, logits)) return;
    for (const int32_t id : trie_->non_ordinary()) {
      const int16_t symbol = trie_->symbol(id);
      if (symbol < 0 || matcher_.Next(state_, symbol) == Matcher::kDead) logits[id] = kOff;
    }
    return;
  }
  const Allowed& allowed = Walk();
  // None fits only past an overflow of the matcher: the grammar alone then.
  if (budgeted && allowed.max_after > limit && WalkWithin(limit, within_) >= 0) {
    MaskBits(within_, logits);
    return;
  }
  MaskBits(allowed.bits, logits);
}

int32_t GrammarConstraint::FreeTextMaxAfter() {
  int32_t max_after = matcher_.MinCompletion(state_);  // every ordinary token keeps the State
  for (int s = kEndOfMsg; s < kNumSymbols; ++s) max_after = std::max(max_after, SpecialAfter(s));
  return max_after;
}

bool GrammarConstraint::MaskFreeTextWithin(int32_t limit, std::span<float> logits) {
  const bool ordinary = matcher_.MinCompletion(state_) <= limit;
  bool any = ordinary;
  for (int s = kEndOfMsg; s < kNumSymbols; ++s) {
    const int32_t after = SpecialAfter(s);
    any |= after >= 0 && after <= limit;
  }
  if (!any) return false;
  for (const int32_t id : trie_->non_ordinary()) {
    const int16_t symbol = trie_->symbol(id);
    const int32_t after = symbol < 0 ? -1 : SpecialAfter(symbol);
    if (after < 0 || after > limit) logits[id] = kOff;
  }
  if (!ordinary) {
    const int vocab = std::min<int>(trie_->vocab_size(), static_cast<int>(logits.size()));
    for (int32_t id = 0; id < vocab; ++id) {
      if (trie_->symbol(id) == TokenTrie::kOrdinary) logits[id] = kOff;
    }
  }
  return true;
}

void GrammarConstraint::Accept(int32_t id) {
  ++accepted_;
  if (failed_) return;
  Matcher::State next = Matcher::kDead;
  if (id >= 0 && id < trie_->vocab_size()) {
    const int16_t symbol = trie_->symbol(id);
    if (symbol == TokenTrie::kOrdinary) {
      next = matcher_.NextBytes(state_, trie_->bytes(id));
    } else if (symbol >= kEndOfMsg) {
      next = matcher_.Next(state_, symbol);
    }
  }
  if (next == Matcher::kDead) {
    std::fprintf(stderr,
                 "k3: token %d does not fit the output grammar; the rest of the turn is not "
                 "constrained\n",
                 id);
    failed_ = true;
    return;
  }
  state_ = next;
  if (matcher_.num_states() > max_states_) {
    state_ = matcher_.Compact(state_);
    allowed_.clear();
  }
}

}  // namespace k3::grammar
