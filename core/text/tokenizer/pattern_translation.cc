// TranslatePattern (core/text/tokenizer/pretokenizer.h): tiktoken's pattern syntax (Rust regex /
// fancy-regex) rewritten as a PCRE2 pattern with the same matches.
#include "core/text/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/util/absl_compat.h"

namespace k3::tokenizer_internal {
namespace {

// Unicode White_Space, which is what \s means in Rust's regex crate (tiktoken's engine).
constexpr std::string_view kWhiteSpaceItems =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";

// General categories: short name, long name. One-letter names and LC are unions of the
// two-letter leaves that start with the same letter (LC: Ll, Lt, Lu).
constexpr std::array<std::pair<std::string_view, std::string_view>, 38> kCategories = {{
    {"C", "Other"},
    {"Cc", "Control"},
    {"Cf", "Format"},
    {"Cn", "Unassigned"},
    {"Co", "Private_Use"},
    {"Cs", "Surrogate"},
    {"L", "Letter"},
    {"LC", "Cased_Letter"},
    {"Ll", "Lowercase_Letter"},
    {"Lm", "Modifier_Letter"},
    {"Lo", "Other_Letter"},
    {"Lt", "Titlecase_Letter"},
    {"Lu", "Uppercase_Letter"},
    {"M", "Mark"},
    {"Mc", "Spacing_Mark"},
    {"Me", "Enclosing_Mark"},
    {"Mn", "Nonspacing_Mark"},
    {"N", "Number"},
    {"Nd", "Decimal_Number"},
    {"Nl", "Letter_Number"},
    {"No", "Other_Number"},
    {"P", "Punctuation"},
    {"Pc", "Connector_Punctuation"},
    {"Pd", "Dash_Punctuation"},
    {"Pe", "Close_Punctuation"},
    {"Pf", "Final_Punctuation"},
    {"Pi", "Initial_Punctuation"},
    {"Po", "Other_Punctuation"},
    {"Ps", "Open_Punctuation"},
    {"S", "Symbol"},
    {"Sc", "Currency_Symbol"},
    {"Sk", "Modifier_Symbol"},
    {"Sm", "Math_Symbol"},
    {"So", "Other_Symbol"},
    {"Z", "Separator"},
    {"Zl", "Line_Separator"},
    {"Zp", "Paragraph_Separator"},
    {"Zs", "Space_Separator"},
}};

// Rust's loose matching of property names: case, spaces, '_' and '-' do not matter.
std::string NormalizeName(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c != ' ' && c != '_' && c != '-') out.push_back(absl::ascii_tolower(c));
  }
  return out;
}

std::optional<std::string> CanonicalCategory(std::string_view name) {
  const std::string norm = NormalizeName(name);
  if (norm == "combiningmark") return "M";
  if (norm == "l&") return "LC";  // PCRE2's spelling, as emitted for \p{LC}
  for (const auto& [short_name, long_name] : kCategories) {
    if (norm == NormalizeName(short_name) || norm == NormalizeName(long_name)) {
      return std::string(short_name);
    }
  }
  return std::nullopt;
}

// The two-letter categories that a category name covers.
std::set<std::string> CategoryLeaves(const std::string& category) {
  std::set<std::string> leaves;
  for (const auto& [short_name, long_name] : kCategories) {
    if (short_name.size() != 2 || short_name == "LC") continue;
    const bool in = category.size() == 1 ? short_name[0] == category[0]
                    : category == "LC"
                        ? (short_name == "Ll" || short_name == "Lt" || short_name == "Lu")
                        : short_name == category;
    if (in) leaves.insert(std::string(short_name));
  }
  return leaves;
}

bool CompilesAsPcre2(const std::string& pattern) {
  int error;
  PCRE2_SIZE offset;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) return false;
  pcre2_code_free(code);
  return true;
}

// One item of a PCRE2 character class. Property items remember their name so that a union of
// general categories can be complemented.
struct Atom {
  std::string text;      // as written inside a PCRE2 class: "a", "\\x{41}-\\x{5a}", "\\p{Lu}"
  std::string property;  // "Lu", "sc:Han", ... or empty when not a property
  bool negated = false;  // \P{...}
};

Atom PropertyAtom(std::string property, bool negated) {
  return {absl::StrCat(negated ? "\\P{" : "\\p{", property, "}"), std::move(property), negated};
}

// A set of characters as PCRE2 class items: their union, or its complement when `negated`.
struct FlatSet {
  bool negated = false;
  std::vector<Atom> atoms;
};

// A parsed Rust character class: the intersection (&&) of operands, each a union of atoms and
// nested classes, complemented as a whole when `negated`.
struct ClassNode {
  struct Union {
    std::vector<Atom> atoms;
    std::vector<ClassNode> nested;
  };
  bool negated = false;
  std::vector<Union> operands;
};

// Complement of a union of atoms as a union of atoms, when PCRE2 can express it.
std::optional<std::vector<Atom>> Complement(const std::vector<Atom>& atoms) {
  if (atoms.size() == 1 && !atoms[0].property.empty()) {
    return std::vector<Atom>{PropertyAtom(atoms[0].property, !atoms[0].negated)};
  }
  std::set<std::string> covered;
  for (const Atom& atom : atoms) {
    if (atom.property.empty() || atom.negated) return std::nullopt;
    const std::optional<std::string> category = CanonicalCategory(atom.property);
    if (!category) return std::nullopt;
    covered.merge(CategoryLeaves(*category));
  }
  // The other leaves, grouped back into one-letter categories where all of a letter remain.
  std::vector<Atom> result;
  for (const std::string major : {"L", "M", "N", "P", "S", "Z", "C"}) {
    std::vector<std::string> missing;
    const std::set<std::string> leaves = CategoryLeaves(major);
    for (const std::string& leaf : leaves) {
      if (!covered.contains(leaf)) missing.push_back(leaf);
    }
    if (missing.size() == leaves.size()) {
      result.push_back(PropertyAtom(major, false));
    } else {
      for (std::string& leaf : missing) result.push_back(PropertyAtom(std::move(leaf), false));
    }
  }
  return result;
}

std::optional<FlatSet> Flatten(const ClassNode& node);

std::optional<FlatSet> FlattenUnion(const ClassNode::Union& u) {
  FlatSet set{false, u.atoms};
  std::vector<FlatSet> complements;
  for (const ClassNode& nested : u.nested) {
    std::optional<FlatSet> f = Flatten(nested);
    if (!f) return std::nullopt;
    if (!f->negated) {
      set.atoms.insert(set.atoms.end(), f->atoms.begin(), f->atoms.end());
    } else {
      complements.push_back(std::move(*f));
    }
  }
  if (complements.empty()) return set;
  if (complements.size() == 1 && set.atoms.empty()) return complements[0];
  // A | not B: express not B positively, if possible.
  for (const FlatSet& c : complements) {
    std::optional<std::vector<Atom>> positive = Complement(c.atoms);
    if (!positive) return std::nullopt;
    set.atoms.insert(set.atoms.end(), positive->begin(), positive->end());
  }
  return set;
}

std::optional<FlatSet> Flatten(const ClassNode& node) {
  std::optional<FlatSet> result;
  if (node.operands.size() == 1) {
    result = FlattenUnion(node.operands[0]);
    if (!result) return std::nullopt;
  } else {
    // A && B && ... = not (not A | not B | ...).
    result = FlatSet{true, {}};
    for (const ClassNode::Union& operand : node.operands) {
      std::optional<FlatSet> f = FlattenUnion(operand);
      if (!f) return std::nullopt;
      if (f->negated) {
        result->atoms.insert(result->atoms.end(), f->atoms.begin(), f->atoms.end());
      } else {
        std::optional<std::vector<Atom>> c = Complement(f->atoms);
        if (!c) return std::nullopt;
        result->atoms.insert(result->atoms.end(), c->begin(), c->end());
      }
    }
  }
  if (node.negated) result->negated = !result->negated;
  return result;
}

// A PCRE2 expression that matches one character of `set`.
std::string EmitFlat(const FlatSet& set) {
  if (set.atoms.empty()) return set.negated ? "(?s:.)" : "(?!)";
  std::string out = set.negated ? "[^" : "[";
  for (const Atom& atom : set.atoms) out += atom.text;
  out += "]";
  return out;
}

// Fallback for classes that Flatten cannot turn into one PCRE2 class: lookaheads.
std::string EmitGeneric(const ClassNode& node);

std::string EmitUnion(const ClassNode::Union& u) {
  std::vector<std::string> alternatives;
  if (!u.atoms.empty()) alternatives.push_back(EmitFlat({false, u.atoms}));
  for (const ClassNode& nested : u.nested) {
    const std::optional<FlatSet> f = Flatten(nested);
    alternatives.push_back(f ? EmitFlat(*f) : EmitGeneric(nested));
  }
  if (alternatives.empty()) return "(?!)";
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(?:";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    absl::StrAppend(&out, i ? "|" : "", alternatives[i]);
  }
  return out + ")";
}

std::string EmitGeneric(const ClassNode& node) {
  std::string body = "(?:";
  for (size_t i = 0; i + 1 < node.operands.size(); ++i) {
    absl::StrAppend(&body, "(?=", EmitUnion(node.operands[i]), ")");
  }
  absl::StrAppend(&body, EmitUnion(node.operands.back()), ")");
  if (!node.negated) return body;
  return absl::StrCat("(?:(?!", body, ")(?s:.))");
}

class Translator {
 public:
  explicit Translator(std::string_view pattern) : p_(pattern) {}

  absl::StatusOr<std::string> Run() {
    std::string out;
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        absl::Status status = TranslateEscape(&out);
        if (!status.ok()) return status;
      } else if (c == '[') {
        absl::StatusOr<ClassNode> node = ParseClass();
        if (!node.ok()) return node.status();
        const std::optional<FlatSet> flat = Flatten(*node);
        out += flat ? EmitFlat(*flat) : EmitGeneric(*node);
      } else {
        out.push_back(c);
        ++i_;
      }
    }
    return out;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pat_str: ", Av(what), " at offset ", i_, " of \"", Av(p_), "\""));
  }

  // Reads the property after \p or \P (p_[i_] is the first character after the letter).
  absl::StatusOr<std::string> ParsePropertyName() {
    if (i_ >= p_.size()) return Error("\\p without a property");
    std::string_view name;
    if (p_[i_] == '{') {
      const size_t close = p_.find('}', i_);
      if (close == std::string_view::npos) return Error("unterminated \\p{");
      name = p_.substr(i_ + 1, close - i_ - 1);
      i_ = close + 1;
    } else {
      name = p_.substr(i_, 1);
      ++i_;
    }
    const size_t eq = name.find_first_of("=:");
    if (eq != std::string_view::npos) {
      const std::string key = NormalizeName(name.substr(0, eq));
      const std::string_view value = name.substr(eq + 1);
      if (key == "gc" || key == "generalcategory") {
        if (std::optional<std::string> category = CanonicalCategory(value)) return *category;
      } else if (key == "sc" || key == "script") {
        return absl::StrCat("sc:", Av(value));
      } else if (key == "scx" || key == "scriptextensions") {
        return absl::StrCat("scx:", Av(value));
      }
      return Error(absl::StrCat("unsupported property \\p{", Av(name), "}"));
    }
    if (std::optional<std::string> category = CanonicalCategory(name)) {
      return *category == "LC" ? std::string("L&") : *category;
    }
    // Rust reads a bare name that is no category as a Script, PCRE2 as Script_Extensions.
    const std::string script = absl::StrCat("sc:", Av(name));
    if (CompilesAsPcre2(absl::StrCat("\\p{", script, "}"))) return script;
    return std::string(name);  // a binary property; PCRE2 has the same names
  }

  // Reads a \x, \u or \U code point escape (p_[i_] is the letter) as PCRE2's \x{...}.
  absl::StatusOr<std::string> ParseHexEscape() {
    const char kind = p_[i_++];
    std::string_view digits;
    if (i_ < p_.size() && p_[i_] == '{') {
      const size_t close = p_.find('}', i_);
      if (close == std::string_view::npos) return Error("unterminated \\x{");
      digits = p_.substr(i_ + 1, close - i_ - 1);
      i_ = close + 1;
    } else {
      const size_t count = kind == 'x' ? 2 : kind == 'u' ? 4 : 8;
      digits = p_.substr(i_, count);
      i_ += digits.size();
    }
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isxdigit)) {
      return Error("bad hexadecimal escape");
    }
    return absl::StrCat("\\x{", Av(digits), "}");
  }

  // Escapes that mean a single character (p_[i_] is the letter after the backslash).
  absl::StatusOr<std::string> ParseCharEscape() {
    const char c = p_[i_];
    if (c == 'x' || c == 'u' || c == 'U') return ParseHexEscape();
    ++i_;
    switch (c) {
      case 'v':  // a vertical tab in Rust, a class of vertical space in PCRE2
        return std::string("\\x{b}");
      case 'n':
      case 'r':
      case 't':
      case 'f':
      case 'a':
        return absl::StrCat("\\", absl::string_view(&c, 1));
      default:
        if (absl::ascii_isalnum(c)) {
          return Error(absl::StrCat("unsupported escape \\", absl::string_view(&c, 1)));
        }
        return absl::StrCat("\\", absl::string_view(&c, 1));  // escaped punctuation
    }
  }

  absl::Status TranslateEscape(std::string* out) {
    ++i_;  // the backslash
    if (i_ >= p_.size()) return Error("trailing backslash");
    const char c = p_[i_];
    switch (c) {
      case 's':
        ++i_;
        absl::StrAppend(out, "[", Av(kWhiteSpaceItems), "]");
        return absl::OkStatus();
      case 'S':
        ++i_;
        absl::StrAppend(out, "[^", Av(kWhiteSpaceItems), "]");
        return absl::OkStatus();
      case 'd':
      case 'D':
        ++i_;
        absl::StrAppend(out, c == 'd' ? "\\p{Nd}" : "\\P{Nd}");
        return absl::OkStatus();
      case 'p':
      case 'P': {
        ++i_;
        absl::StatusOr<std::string> name = ParsePropertyName();
        if (!name.ok()) return name.status();
        absl::StrAppend(out, c == 'p' ? "\\p{" : "\\P{", *name, "}");
        return absl::OkStatus();
      }
      case 'A':
      case 'z':
        ++i_;
        absl::StrAppend(out, "\\", absl::string_view(&c, 1));
        return absl::OkStatus();
      case 'w':
      case 'W':
      case 'b':
      case 'B':
        return Error(absl::StrCat("\\", absl::string_view(&c, 1),
                                  " is not supported (its Unicode meaning differs in PCRE2)"));
      default: {
        absl::StatusOr<std::string> escaped = ParseCharEscape();
        if (!escaped.ok()) return escaped.status();
        *out += *escaped;
        return absl::OkStatus();
      }
    }
  }

  // One class character at p_[i_] (not '\\'): its PCRE2 spelling, a whole UTF-8 sequence.
  std::string ParseLiteralChar() {
    const unsigned char lead = static_cast<unsigned char>(p_[i_]);
    const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    const std::string_view text = p_.substr(i_, len);
    i_ += text.size();
    // Escape ASCII punctuation: atoms may be reordered, and "-", "^", "]" must stay literal.
    const bool escape = len == 1 && !absl::ascii_isalnum(lead) && lead >= 0x20;
    return absl::StrCat(escape ? "\\" : "", Av(text));
  }

  // p_[i_] == '['.
  absl::StatusOr<ClassNode> ParseClass() {
    const size_t open = i_++;
    ClassNode node;
    if (i_ < p_.size() && p_[i_] == '^') {
      node.negated = true;
      ++i_;
    }
    node.operands.emplace_back();
    bool first = true;
    for (;;) {
      if (i_ >= p_.size()) {
        i_ = open;
        return Error("unterminated character class");
      }
      const char c = p_[i_];
      if (c == ']' && !first) {
        ++i_;
        return node;
      }
      first = false;
      if (p_.substr(i_, 2) == "&&") {
        i_ += 2;
        node.operands.emplace_back();
        continue;
      }
      if (p_.substr(i_, 2) == "--" || p_.substr(i_, 2) == "~~") {
        return Error("class difference and symmetric difference are not supported");
      }
      ClassNode::Union& u = node.operands.back();
      if (c == '[') {
        if (p_.substr(i_, 2) == "[:") return Error("POSIX classes [:name:] are not supported");
        absl::StatusOr<ClassNode> nested = ParseClass();
        if (!nested.ok()) return nested.status();
        u.nested.push_back(std::move(*nested));
        continue;
      }
      if (c == '\\' && i_ + 1 < p_.size()) {
        const char e = p_[i_ + 1];
        if (e == 's' || e == 'S') {
          i_ += 2;
          ClassNode space;
          space.negated = e == 'S';
          space.operands.push_back({{Atom{std::string(kWhiteSpaceItems), "", false}}, {}});
          if (e == 's') {
            u.atoms.push_back(space.operands[0].atoms[0]);
          } else {
            u.nested.push_back(std::move(space));
          }
          continue;
        }
        if (e == 'd' || e == 'D') {
          i_ += 2;
          u.atoms.push_back(PropertyAtom("Nd", e == 'D'));
          continue;
        }
        if (e == 'p' || e == 'P') {
          i_ += 2;
          absl::StatusOr<std::string> name = ParsePropertyName();
          if (!name.ok()) return name.status();
          u.atoms.push_back(PropertyAtom(std::move(*name), e == 'P'));
          continue;
        }
        if (e == 'w' || e == 'W' || e == 'b' || e == 'B') {
          return Error("\\w, \\W, \\b, \\B are not supported (their Unicode meaning differs)");
        }
      }
      // A single character, or a range of two.
      absl::StatusOr<std::string> lo = ParseClassChar();
      if (!lo.ok()) return lo.status();
      std::string text = *lo;
      if (p_.substr(i_, 1) == "-" && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        absl::StatusOr<std::string> hi = ParseClassChar();
        if (!hi.ok()) return hi.status();
        absl::StrAppend(&text, "-", *hi);
      }
      u.atoms.push_back({std::move(text), "", false});
    }
  }

  absl::StatusOr<std::string> ParseClassChar() {
    if (p_[i_] != '\\') return ParseLiteralChar();
    ++i_;
    if (i_ >= p_.size()) return Error("trailing backslash");
    return ParseCharEscape();
  }

  std::string_view p_;
  size_t i_ = 0;
};

}  // namespace

absl::StatusOr<std::string> TranslatePattern(std::string_view pat_str) {
  return Translator(pat_str).Run();
}

}  // namespace k3::tokenizer_internal
