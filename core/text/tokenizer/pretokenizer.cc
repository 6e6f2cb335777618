// PreTokenizer: the translated pattern compiled once with PCRE2 (JIT where it can) and the
// text split into pieces with it.
#include "core/text/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace k3::tokenizer_internal {
namespace {

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) return absl::StrCat(code);
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread match scratch: match data and a JIT stack large enough for any backtracking that
// chunked input can cause. Shared by all PreTokenizers: neither depends on the pattern.
struct MatchScratch {
  MatchScratch()
      : match_data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        jit_stack(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
  pcre2_match_data* match_data;
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;
};

}  // namespace
struct PreTokenizer::Compiled {
  ~Compiled() { pcre2_code_free(code); }
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string pattern;
};

PreTokenizer::PreTokenizer(std::unique_ptr<Compiled> compiled) : compiled_(std::move(compiled)) {}
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

const std::string& PreTokenizer::pcre2_pattern() const { return compiled_->pattern; }

absl::StatusOr<PreTokenizer> PreTokenizer::Create(std::string_view pat_str) {
  absl::StatusOr<std::string> pattern = TranslatePattern(pat_str);
  if (!pattern.ok()) return pattern.status();
  auto compiled = std::make_unique<Compiled>();
  compiled->pattern = *std::move(pattern);
  int error;
  PCRE2_SIZE offset;
  // As in Rust: "." excludes only LF, and "$" (without (?m)) matches only at the very end.
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  compiled->code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(compiled->pattern.data()), compiled->pattern.size(),
      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &error, &offset, context);
  pcre2_compile_context_free(context);
  if (compiled->code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pat_str: PCRE2 rejects the translated pattern \"", compiled->pattern,
                     "\" at offset ", offset, ": ", Pcre2Error(error)));
  }
  // Without JIT (an unsupported CPU) the interpreter gives the same matches, slower.
  compiled->jit = pcre2_jit_compile(compiled->code, PCRE2_JIT_COMPLETE) == 0;
  return PreTokenizer(std::move(compiled));
}

void PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  thread_local MatchScratch scratch;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.match_data);
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = compiled_->jit
                       ? pcre2_jit_match(compiled_->code, subject, text.size(), pos, 0,
                                         scratch.match_data, scratch.context)
                       : pcre2_match(compiled_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                     scratch.match_data, scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      pieces->push_back(text.substr(pos));
      return;
    }
    const size_t start = ovector[0], end = ovector[1];
    if (end > start) {
      pieces->push_back(text.substr(start, end - start));
      pos = end;
    } else {
      // An empty match (impossible for the tokenizer patterns): step over one character.
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

}  // namespace k3::tokenizer_internal
