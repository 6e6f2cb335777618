// A context-free grammar over symbols, the input of the pushdown matcher (matcher.h). A symbol is
// an ordinary byte (0-255) or one of the four XTML special tokens (TOOLS.md section 2): a token
// is matched as the sequence of its bytes, or as its one special symbol. The rules follow
// llama.cpp's grammar engine: each rule is alternatives of sequences whose elements are symbol
// sets or references to rules; repetition is written as right recursion, which the matcher runs
// in constant stack depth.
//
//   GrammarBuilder b;
//   RuleId digits = b.Plus({b.Set(SymbolSet::Range('0', '9'))});
//   RuleId start = b.Rule("n", {b.Cat({b.Text("n="), {b.Ref(digits)}})});
//   Grammar g = std::move(b).Build(start);
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::grammar {

// The special symbols follow the 256 bytes.
inline constexpr int kEndOfMsg = 256;
inline constexpr int kOpen = 257;
inline constexpr int kClose = 258;
inline constexpr int kSep = 259;
inline constexpr int kNumSymbols = 260;

// A set of symbols, 260 bits.
class SymbolSet {
 public:
  static SymbolSet Of(int symbol) {
    SymbolSet s;
    s.Add(symbol);
    return s;
  }
  static SymbolSet Range(int lo, int hi) {  // inclusive
    SymbolSet s;
    for (int c = lo; c <= hi; ++c) s.Add(c);
    return s;
  }
  // Every byte listed in `bytes`.
  static SymbolSet Bytes(std::string_view bytes);
  void Add(int symbol) { bits_[symbol >> 6] |= uint64_t{1} << (symbol & 63); }
  void Remove(int symbol) { bits_[symbol >> 6] &= ~(uint64_t{1} << (symbol & 63)); }
  bool Has(int symbol) const { return (bits_[symbol >> 6] >> (symbol & 63)) & 1; }
  SymbolSet& operator|=(const SymbolSet& o) {
    for (size_t i = 0; i < bits_.size(); ++i) bits_[i] |= o.bits_[i];
    return *this;
  }
  bool operator==(const SymbolSet& o) const = default;

 private:
  std::array<uint64_t, 5> bits_{};
};

using RuleId = int32_t;

// One element of a sequence: a symbol set (kSet, index into Grammar::sets), a rule (kRef) or the
// end of the alternative (kEnd).
struct Element {
  enum Kind : uint8_t { kSet, kRef, kEnd };
  Kind kind = kEnd;
  int32_t arg = 0;
};

// The compiled grammar: every alternative's elements, end-terminated, in one array.
struct Grammar {
  std::vector<Element> elements;
  std::vector<SymbolSet> sets;
  std::vector<std::vector<uint32_t>> alternatives;  // per rule, the index of each alternative
  std::vector<std::string> names;                   // per rule, for diagnostics
  RuleId start = 0;
};

class GrammarBuilder {
 public:
  using Seq = std::vector<Element>;

  Element Set(const SymbolSet& set);
  static Element Ref(RuleId rule) { return {Element::kRef, rule}; }
  Element Symbol(int symbol) { return Set(SymbolSet::Of(symbol)); }
  // The bytes of `text`, one element each.
  Seq Text(std::string_view text);

  // A rule with no alternatives yet (for recursion), and adding them.
  RuleId NewRule(std::string name);
  void AddAlternative(RuleId rule, Seq seq);
  // A rule of one or more alternatives, and the sequence concatenation helper.
  RuleId Rule(std::string name, std::vector<Seq> alternatives);
  static Seq Cat(std::initializer_list<Seq> parts);
  // Repetitions of `seq` as rules: x?, x*, x+, and x{min,max} (max < 0: unbounded).
  RuleId Optional(Seq seq);
  RuleId Star(Seq seq);
  RuleId Plus(Seq seq);
  RuleId Repeat(const Seq& seq, int min, int max);
  // A rule matching exactly `seq` (to reference a sequence).
  RuleId Wrap(Seq seq) { return Rule("seq", {std::move(seq)}); }

  int num_rules() const { return static_cast<int>(rules_.size()); }
  Grammar Build(RuleId start) &&;

 private:
  std::vector<std::vector<Seq>> rules_;
  std::vector<std::string> names_;
  std::vector<SymbolSet> sets_;
};

// The grammar's rules in a BNF-like text, for debugging and tests.
std::string Describe(const Grammar& g);

}  // namespace k3::grammar
