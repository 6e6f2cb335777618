// Constrained decoding: which tokens keep the output a prefix of a grammar's language.
//
// TokenTrie holds the vocabulary as a byte trie, built once per tokenizer and shared by every
// request (it is immutable). GrammarConstraint is one request's: it walks the trie from the
// matcher's State, pruning a subtree at the first byte the grammar refuses, so a Mask costs the
// trie nodes still alive rather than the vocabulary's bytes. Where the grammar is free text
// (a think body, a response, a string argument), every ordinary token is allowed and only the
// special ids are decided, without a walk.
//
// A token budget (set_token_budget) keeps the turn completable: near the budget, a token is
// allowed only if the shortest completion after it (Matcher::MinCompletion, in symbols, each one
// token at most) fits in the tokens left, so a forced call or JSON document ends whole, with
// <|end_of_msg|> at the latest as the budget's last token.
//
//   auto trie = TokenTrie::Build(tokenizer);                     // once
//   auto c = GrammarConstraint::ForOutput(spec, *trie);          // per request
//   (*c)->set_token_budget(request.max_tokens);                  // a forced call ends whole
//   request.constraint = *std::move(c);                          // pipeline/batch_scheduler.h
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/text/grammar/grammar.h"
#include "core/text/grammar/matcher.h"
#include "core/model/token_constraint.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"

namespace k3::grammar {

class TokenTrie {
 public:
  // Fails if the tokenizer lacks one of the four XTML special tokens.
  static absl::StatusOr<std::shared_ptr<const TokenTrie>> Build(const Tokenizer& tokenizer);

  int vocab_size() const { return static_cast<int>(symbol_.size()); }
  // A token's one symbol (kEndOfMsg..kSep) if it is an XTML special, kOrdinary for a token
  // matched by its bytes, kNever for the ids no grammar allows (other specials, gaps).
  static constexpr int16_t kOrdinary = -1;
  static constexpr int16_t kNever = -2;
  int16_t symbol(int32_t id) const { return symbol_[id]; }
  std::string_view bytes(int32_t id) const {
    return std::string_view(pool_).substr(offset_[id], offset_[id + 1] - offset_[id]);
  }
  int32_t special_id(int symbol) const { return special_ids_[symbol - kEndOfMsg]; }
  // The ids that are not ordinary (specials and kNever), which free text must still decide.
  const std::vector<int32_t>& non_ordinary() const { return non_ordinary_; }

  // The trie in preorder; node 0 is the root (no byte). A node's subtree is [node, end).
  struct Node {
    int32_t parent;
    int32_t end;
    int32_t first_token, last_token;  // tokens_[first_token, last_token) end here
    uint8_t byte;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::vector<int16_t> symbol_;
  std::vector<uint32_t> offset_;  // vocab_size() + 1
  std::string pool_;
  int32_t special_ids_[4] = {};
  std::vector<int32_t> non_ordinary_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
};

class GrammarConstraint : public TokenConstraint {
 public:
  // Above this many matcher States (about 1 KB each) the matcher forgets all but the current.
  static constexpr int kMaxStates = 16384;
  // Masks kept per State (a bit per token, 20 KB with K3's vocabulary): a turn revisits few
  // States (inside a string, a number, a key), and a known one costs no walk.
  static constexpr int kMaxCachedMasks = 256;

  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);
  // The constraint of one turn (output_grammar.h); fails on a spec CheckOutputSpec refuses.
  static absl::StatusOr<std::unique_ptr<GrammarConstraint>> ForOutput(
      const OutputSpec& spec, std::shared_ptr<const TokenTrie> trie);

  void Mask(std::span<float> logits) override;
  // A token Mask did not allow ends the constraint: the error is reported once on stderr and
  // the rest of the turn is sampled freely (failed()).
  void Accept(int32_t id) override;

  // The output so far is a complete turn.
  bool finished() const { return !failed_ && matcher_.Accepting(state_); }
  bool failed() const { return failed_; }
  // Whether the current State is free text (Mask's fast path).
  bool free_text() { return !failed_ && matcher_.FreeText(state_); }
  // Off: every Mask walks the trie (for the benchmark's cold figure).
  void set_cache_masks(bool on) { cache_masks_ = on; }
  // Lowers kMaxStates (tests: to make the matcher forget often).
  void set_max_states(int n) { max_states_ = n; }
  // The tokens the turn may still sample, counted from the constraint's start (Accept counts
  // them down). While the tokens left are fewer than the shortest completion, Mask is the
  // grammar's alone (the turn will be cut, unless tokens that spell several of its symbols
  // bring it back within the budget, which then holds).
  void set_token_budget(int max_tokens);
  // The tokens left, or -1 without a budget.
  int remaining_tokens() const { return budget_ < 0 ? -1 : std::max(budget_ - accepted_, 0); }
  // The fewest symbols that complete the turn from here (Matcher::MinCompletion).
  int min_completion() { return matcher_.MinCompletion(state_); }

 private:
  struct Allowed {
    std::vector<uint64_t> bits;
    int32_t max_after = -1;  // the largest MinCompletion after one allowed token (a budget's)
  };
  // The allowed ids of the current State (not free text), cached per State.
  const Allowed& Walk();
  // Sets in `bits` the ids allowed from the current State whose MinCompletion after them is at
  // most `limit`; returns the largest such MinCompletion (-1 if none). Without a budget, every
  // allowed id, returning -1.
  int32_t WalkWithin(int32_t limit, std::vector<uint64_t>& bits);
  // MinCompletion after a special symbol, -1 if the grammar refuses it here.
  int32_t SpecialAfter(int symbol);
  // Turns off every id not in `bits` (all but <|end_of_msg|> if `bits` is empty).
  void MaskBits(const std::vector<uint64_t>& bits, std::span<float> logits);
  // In free text: the largest MinCompletion after one token, and the mask of those whose
  // MinCompletion after them is at most `limit` (false, masking nothing, if no token's is).
  int32_t FreeTextMaxAfter();
  bool MaskFreeTextWithin(int32_t limit, std::span<float> logits);

  std::shared_ptr<const TokenTrie> trie_;
  Matcher matcher_;
  Matcher::State state_;
  bool failed_ = false;
  bool cache_masks_ = true;
  int max_states_ = kMaxStates;
  int budget_ = -1;
  int accepted_ = 0;
  absl::flat_hash_map<Matcher::State, Allowed> allowed_;
  std::vector<uint64_t> within_;  // MaskWithin's bits, kept for their memory
};

}  // namespace k3::grammar
