#include "core/text/tokenizer/unicode.h"

#include <cstdint>

namespace k3::tokenizer_internal {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at text[i], or 0 when it is ill-formed. `max_part`
// receives the length of the maximal subpart that one U+FFFD replaces (at least 1).
size_t SequenceLength(std::string_view text, size_t i, size_t* max_part) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  *max_part = 1;
  if (lead < 0x80) return 1;
  size_t need;
  uint8_t lower = 0x80, upper = 0xBF;  // the allowed range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lower = 0xA0;  // overlong
    if (lead == 0xED) upper = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lower = 0x90;  // overlong
    if (lead == 0xF4) upper = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  size_t j = i + 1;
  for (size_t k = 0; k < need; ++k, ++j) {
    if (j >= text.size() || byte(j) < lower || byte(j) > upper) {
      *max_part = j - i;
      return 0;
    }
    lower = 0x80;
    upper = 0xBF;
  }
  return need + 1;
}

// Decodes the code point at text[i] of valid UTF-8 and advances i.
char32_t NextCodePoint(std::string_view text, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<uint8_t>(text[k])); };
  const char32_t lead = byte(*i);
  if (lead < 0x80) {
    *i += 1;
    return lead;
  }
  if (lead < 0xE0) {
    const char32_t c = ((lead & 0x1F) << 6) | (byte(*i + 1) & 0x3F);
    *i += 2;
    return c;
  }
  if (lead < 0xF0) {
    const char32_t c = ((lead & 0x0F) << 12) | ((byte(*i + 1) & 0x3F) << 6) | (byte(*i + 2) & 0x3F);
    *i += 3;
    return c;
  }
  const char32_t c = ((lead & 0x07) << 18) | ((byte(*i + 1) & 0x3F) << 12) |
                     ((byte(*i + 2) & 0x3F) << 6) | (byte(*i + 3) & 0x3F);
  *i += 4;
  return c;
}

}  // namespace

bool RepairUtf8(std::string_view text, std::string* out) {
  size_t i = 0;
  size_t max_part;
  // Fast scan: most input is valid and needs no copy.
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = SequenceLength(text, i, &max_part);
    if (len == 0) break;
    i += len;
  }
  if (i == text.size()) return false;

  out->clear();
  out->reserve(text.size() + 16);
  out->append(text.substr(0, i));
  while (i < text.size()) {
    const size_t len = SequenceLength(text, i, &max_part);
    if (len == 0) {
      out->append(kReplacement);
      i += max_part;
    } else {
      out->append(text.substr(i, len));
      i += len;
    }
  }
  return true;
}

bool IsPythonSpace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

void ChunkText(std::string_view text, size_t max_slice_chars, size_t max_run_chars,
               std::vector<std::string_view>* chunks) {
  if (text.empty()) return;
  // A text of at most max_run_chars bytes has at most that many characters: nothing to cut.
  if (text.size() <= max_run_chars && text.size() <= max_slice_chars) {
    chunks->push_back(text);
    return;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    // One slice of at most max_slice_chars characters, split exactly as the official
    // _split_whitespaces_or_nonwhitespaces does: the first character starts a run of length 1,
    // and a character that would make its run longer than the limit starts a new piece.
    size_t piece_start = pos;
    size_t probe = pos;
    bool run_is_space = IsPythonSpace(NextCodePoint(text, &probe));
    size_t run_len = 0;
    for (size_t count = 0; pos < text.size() && count < max_slice_chars; ++count) {
      const size_t char_start = pos;
      const auto byte = static_cast<unsigned char>(text[pos]);
      bool is_space;
      if (byte < 0x80) {  // ASCII fast path
        is_space = (byte >= 0x09 && byte <= 0x0D) || (byte >= 0x1C && byte <= 0x20);
        ++pos;
      } else {
        is_space = IsPythonSpace(NextCodePoint(text, &pos));
      }
      if (is_space != run_is_space) {
        run_len = 1;
        run_is_space = is_space;
      } else if (++run_len > max_run_chars) {
        chunks->push_back(text.substr(piece_start, char_start - piece_start));
        piece_start = char_start;
        run_len = 1;
      }
    }
    chunks->push_back(text.substr(piece_start, pos - piece_start));
  }
}

}  // namespace k3::tokenizer_internal
