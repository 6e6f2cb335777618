#include "core/text/grammar/grammar.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace k3::grammar {

SymbolSet SymbolSet::Bytes(std::string_view bytes) {
  SymbolSet s;
  for (const char c : bytes) s.Add(static_cast<unsigned char>(c));
  return s;
}

Element GrammarBuilder::Set(const SymbolSet& set) {
  // Grammars reuse few distinct sets (one per byte of literal text at most), so a linear search
  // keeps the table small without a hash.
  for (size_t i = 0; i < sets_.size(); ++i) {
    if (sets_[i] == set) return {Element::kSet, static_cast<int32_t>(i)};
  }
  sets_.push_back(set);
  return {Element::kSet, static_cast<int32_t>(sets_.size() - 1)};
}

GrammarBuilder::Seq GrammarBuilder::Text(std::string_view text) {
  Seq seq;
  seq.reserve(text.size());
  for (const char c : text) seq.push_back(Symbol(static_cast<unsigned char>(c)));
  return seq;
}

RuleId GrammarBuilder::NewRule(std::string name) {
  rules_.emplace_back();
  names_.push_back(std::move(name));
  return static_cast<RuleId>(rules_.size() - 1);
}

void GrammarBuilder::AddAlternative(RuleId rule, Seq seq) {
  rules_[rule].push_back(std::move(seq));
}

RuleId GrammarBuilder::Rule(std::string name, std::vector<Seq> alternatives) {
  const RuleId r = NewRule(std::move(name));
  rules_[r] = std::move(alternatives);
  return r;
}

GrammarBuilder::Seq GrammarBuilder::Cat(std::initializer_list<Seq> parts) {
  Seq out;
  for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

RuleId GrammarBuilder::Optional(Seq seq) { return Rule("opt", {std::move(seq), {}}); }

RuleId GrammarBuilder::Star(Seq seq) {
  // Right recursion: the matcher pops the finished alternative before it pushes the tail call,
  // so the stack stays as deep however many times it repeats.
  const RuleId r = NewRule("star");
  seq.push_back(Ref(r));
  AddAlternative(r, std::move(seq));
  AddAlternative(r, {});
  return r;
}

RuleId GrammarBuilder::Plus(Seq seq) {
  const RuleId star = Star(seq);
  seq.push_back(Ref(star));
  return Rule("plus", {std::move(seq)});
}

RuleId GrammarBuilder::Repeat(const Seq& seq, int min, int max) {
  // The optional tail first: x{0,k} = (x (x (x)?)?)?, nested so that each copy is one rule.
  RuleId tail = -1;
  if (max < 0) {
    tail = Star(seq);
  } else {
    for (int i = min; i < max; ++i) {
      Seq body = seq;
      if (tail >= 0) body.push_back(Ref(tail));
      tail = Optional(std::move(body));
    }
  }
  Seq all;
  for (int i = 0; i < min; ++i) all.insert(all.end(), seq.begin(), seq.end());
  if (tail >= 0) all.push_back(Ref(tail));
  return Rule("repeat", {std::move(all)});
}

Grammar GrammarBuilder::Build(RuleId start) && {
  Grammar g;
  g.sets = std::move(sets_);
  g.names = std::move(names_);
  g.start = start;
  g.alternatives.resize(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Seq& alt : rules_[r]) {
      g.alternatives[r].push_back(static_cast<uint32_t>(g.elements.size()));
      g.elements.insert(g.elements.end(), alt.begin(), alt.end());
      g.elements.push_back({Element::kEnd, 0});
    }
  }
  return g;
}

namespace {

std::string DescribeSet(const SymbolSet& set) {
  static constexpr const char* kSpecials[] = {"<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"};
  std::string out;
  int count = 0;
  for (int c = 0; c < kNumSymbols; ++c) count += set.Has(c);
  if (count == 1) {
    for (int c = 0; c < kNumSymbols; ++c) {
      if (!set.Has(c)) continue;
      if (c >= 256) return kSpecials[c - 256];
      if (c >= 0x20 && c < 0x7f && c != '\'') return absl::StrCat("'", std::string(1, c), "'");
      return absl::StrFormat("\\x%02x", c);
    }
  }
  out = "[";
  for (int c = 0; c < kNumSymbols; ++c) {
    if (!set.Has(c)) continue;
    int end = c;
    while (end + 1 < kNumSymbols && set.Has(end + 1)) ++end;
    if (end > c) {
      absl::StrAppendFormat(&out, "%x-%x ", c, end);
    } else {
      absl::StrAppendFormat(&out, "%x ", c);
    }
    c = end;
  }
  out.back() = ']';
  return out;
}

}  // namespace

std::string Describe(const Grammar& g) {
  std::string out;
  for (size_t r = 0; r < g.alternatives.size(); ++r) {
    absl::StrAppend(&out, g.names[r], "#", r, " ::=");
    for (size_t a = 0; a < g.alternatives[r].size(); ++a) {
      if (a > 0) out += " |";
      for (uint32_t e = g.alternatives[r][a]; g.elements[e].kind != Element::kEnd; ++e) {
        const Element& el = g.elements[e];
        out += " ";
        out += el.kind == Element::kSet ? DescribeSet(g.sets[el.arg])
                                        : absl::StrCat(g.names[el.arg], "#", el.arg);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace k3::grammar
