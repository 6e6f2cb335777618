#include "core/json_stream.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/absl_compat.h"

namespace k3 {
namespace {

using tokenizer_internal::Av;

// Deep enough for any real header; a bound so that a hostile file cannot exhaust the stack.
constexpr size_t kMaxDepth = 512;

// Bytes a string may hold as they are: printable ASCII other than '"' and '\'.
constexpr std::array<bool, 256> kPlainTable = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = c != '"' && c != '\\';
  return t;
}();

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

JsonStream::JsonStream(std::string_view text)
    : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

JsonStream::JsonStream(uint64_t size, Refill refill, std::span<char> window)
    : begin_(window.data()),
      p_(window.data()),
      end_(window.data()),
      remaining_(size),
      refill_(std::move(refill)),
      window_(window) {}

bool JsonStream::Fill() {
  if (!error_.empty() || remaining_ == 0 || !refill_) return false;
  consumed_ += static_cast<uint64_t>(end_ - begin_);
  begin_ = p_ = end_ = window_.data();
  const size_t want = static_cast<size_t>(std::min<uint64_t>(window_.size(), remaining_));
  absl::StatusOr<size_t> got = refill_(window_.first(want));
  if (!got.ok()) return Fail(absl::StrCat("reading: ", got.status().message()));
  if (*got == 0 || *got > want) return Fail("the input ended early");
  remaining_ -= *got;
  end_ = begin_ + *got;
  return true;
}

bool JsonStream::Fail(std::string_view what) {
  if (error_.empty()) error_ = absl::StrCat("at byte ", Offset(), ": ", Av(what));
  return false;
}

bool JsonStream::SkipSpace() {
  for (;;) {
    while (p_ < end_ && IsSpace(*p_)) ++p_;
    if (p_ < end_ || !Fill()) return ok();
  }
}

bool JsonStream::Expect(char c, std::string_view what) {
  if (!SkipSpace()) return false;
  if (!More() || *p_ != c) return Fail(absl::StrCat("expected ", Av(what)));
  ++p_;
  return true;
}

JsonStream::Type JsonStream::Peek() {
  if (!SkipSpace()) return Type::kInvalid;
  if (!More()) return ok() ? Type::kEnd : Type::kInvalid;
  switch (*p_) {
    case '{':
      return Type::kObject;
    case '[':
      return Type::kArray;
    case '"':
      return Type::kString;
    case 't':
    case 'f':
    case 'n':
      return Type::kLiteral;
    default:
      return *p_ == '-' || IsDigit(*p_) ? Type::kNumber : Type::kInvalid;
  }
}

bool JsonStream::BeginObject() {
  if (frames_.size() >= kMaxDepth) return Fail("nested too deeply");
  if (!Expect('{', "'{'")) return false;
  frames_.push_back({true, true});
  return true;
}

bool JsonStream::BeginArray() {
  if (frames_.size() >= kMaxDepth) return Fail("nested too deeply");
  if (!Expect('[', "'['")) return false;
  frames_.push_back({false, true});
  return true;
}

// Past the separator before the next member or element: true if there is one.
bool JsonStream::NextInFrame(bool object) {
  assert(!frames_.empty() && frames_.back().object == object);
  if (!SkipSpace()) return false;
  if (!More())
    return Fail(object ? "the document ends inside an object"
                       : "the document ends "
                         "inside an array");
  const char close = object ? '}' : ']';
  Frame& frame = frames_.back();
  if (*p_ == close) {
    ++p_;
    frames_.pop_back();
    return false;
  }
  if (frame.first) {
    frame.first = false;
    return true;
  }
  if (*p_ != ',') return Fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
  ++p_;
  return true;
}

bool JsonStream::NextMember(std::string& key) {
  if (!ok() || !NextInFrame(true)) return false;
  return ReadString(key) && Expect(':', "':' after a key");
}

bool JsonStream::NextElement() { return ok() && NextInFrame(false); }

bool JsonStream::ReadString(std::string& out) {
  if (!Expect('"', "a string")) return false;
  out.clear();
  for (;;) {
    const char* q = p_;
    while (q < end_ && kPlainTable[static_cast<unsigned char>(*q)]) ++q;
    out.append(p_, q);
    p_ = q;
    if (p_ == end_) {
      if (!Fill()) return Fail("unterminated string");
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(*p_);
    if (c == '"') {
      ++p_;
      return true;
    }
    if (c == '\\') {
      ++p_;
      if (!ReadEscape(out)) return false;
    } else if (c < 0x20) {
      return Fail("control character in a string");
    } else if (!ReadUtf8(out)) {
      return false;
    }
  }
}

bool JsonStream::ReadEscape(std::string& out) {
  auto next = [&](unsigned char& c) {
    if (!More()) return Fail("unterminated string");
    c = static_cast<unsigned char>(*p_++);
    return true;
  };
  auto hex4 = [&](uint32_t& v) {
    v = 0;
    for (int i = 0; i < 4; ++i) {
      unsigned char c = 0;
      if (!next(c)) return false;
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0) return Fail("bad \\u escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return true;
  };
  unsigned char c = 0;
  if (!next(c)) return false;
  switch (c) {
    case '"':
    case '\\':
    case '/':
      out += static_cast<char>(c);
      return true;
    case 'b':
      out += '\b';
      return true;
    case 'f':
      out += '\f';
      return true;
    case 'n':
      out += '\n';
      return true;
    case 'r':
      out += '\r';
      return true;
    case 't':
      out += '\t';
      return true;
    case 'u': {
      uint32_t cp = 0;
      if (!hex4(cp)) return false;
      if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("lone low surrogate in a \\u escape");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned char a = 0, b = 0;
        uint32_t low = 0;
        if (!next(a) || !next(b)) return false;
        if (a != '\\' || b != 'u') return Fail("high surrogate without its low half");
        if (!hex4(low)) return false;
        if (low < 0xDC00 || low > 0xDFFF) return Fail("high surrogate without its low half");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
      AppendUtf8(cp, out);
      return true;
    }
    default:
      return Fail("unknown escape in a string");
  }
}

// One multi-byte UTF-8 sequence, checked as RFC 3629 defines it (no overlong forms, no
// surrogates, nothing past U+10FFFF).
bool JsonStream::ReadUtf8(std::string& out) {
  const unsigned char lead = static_cast<unsigned char>(*p_++);
  int count;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    count = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    count = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    count = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return Fail("invalid UTF-8 in a string");
  }
  out += static_cast<char>(lead);
  for (int i = 0; i < count; ++i) {
    if (!More()) return Fail("unterminated string");
    const unsigned char c = static_cast<unsigned char>(*p_);
    if (c < lo || c > hi) return Fail("invalid UTF-8 in a string");
    out += static_cast<char>(c);
    ++p_;
    lo = 0x80;
    hi = 0xBF;
  }
  return true;
}

bool JsonStream::ReadNumber(uint64_t* value, bool* is_unsigned) {
  if (!SkipSpace()) return false;
  bool integer = true, overflow = false;
  uint64_t v = 0;
  number_.clear();
  auto take = [&] { number_ += *p_++; };
  if (More() && *p_ == '-') take();
  if (!More() || !IsDigit(*p_)) return Fail("expected a number");
  if (*p_ == '0') {
    take();
  } else {
    while (More() && IsDigit(*p_)) {
      const uint64_t d = static_cast<uint64_t>(*p_ - '0');
      if (v > (UINT64_MAX - d) / 10) overflow = true;
      v = v * 10 + d;
      take();
    }
  }
  auto digits = [&]() {
    if (!More() || !IsDigit(*p_)) return Fail("expected a digit");
    while (More() && IsDigit(*p_)) take();
    return true;
  };
  if (More() && *p_ == '.') {
    integer = false;
    take();
    if (!digits()) return false;
  }
  if (More() && (*p_ == 'e' || *p_ == 'E')) {
    integer = false;
    take();
    if (More() && (*p_ == '+' || *p_ == '-')) take();
    if (!digits()) return false;
  }
  const bool negative = number_[0] == '-';
  // What is not a 64-bit integer is a double, and like nlohmann we refuse one that overflows.
  if ((!integer || overflow) && !std::isfinite(std::strtod(number_.c_str(), nullptr))) {
    return Fail("number out of range");
  }
  *is_unsigned = !negative && integer && !overflow;
  *value = v;
  return ok();
}

bool JsonStream::ReadLiteral(std::string_view word) {
  for (char c : word) {
    if (!More() || *p_ != c) return Fail("invalid literal");
    ++p_;
  }
  return true;
}

bool JsonStream::SkipValue() {
  std::string scratch;
  switch (Peek()) {
    case Type::kObject:
      if (!BeginObject()) return false;
      while (NextMember(scratch)) {
        if (!SkipValue()) return false;
      }
      return ok();
    case Type::kArray:
      if (!BeginArray()) return false;
      while (NextElement()) {
        if (!SkipValue()) return false;
      }
      return ok();
    case Type::kString:
      return ReadString(scratch);
    case Type::kNumber: {
      uint64_t v;
      bool u;
      return ReadNumber(&v, &u);
    }
    case Type::kLiteral:
      return ReadLiteral(*p_ == 't' ? "true" : *p_ == 'f' ? "false" : "null");
    case Type::kEnd:
      return Fail("expected a value, the document ends");
    case Type::kInvalid:
      return Fail("expected a value");
  }
  return false;
}

bool JsonStream::Finish() {
  if (!SkipSpace()) return false;
  // nlohmann takes a NUL byte for the end of the input: headers padded with NULs opened
  // before, so they still do.
  if (More() && *p_ != '\0') return Fail("unexpected data after the end of the document");
  return ok();
}

}  // namespace k3
