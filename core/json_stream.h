// A pull reader for large JSON documents that holds only a window of its input. The release's
// safetensors headers (497,052 tensors, ~76 MB) and its index (~60 MB) are read with it: a DOM,
// or a parser that needs the whole text in memory, costs time and RAM in proportion to the
// document, and first-touched memory is slow (docs/CHECKPOINT.md has the figures).
//
// It validates everything it reads, skipped values included (RFC 8259: strings with escapes
// and UTF-8, numbers, literals, nesting), so invalid JSON is refused wherever it is. Errors are
// sticky: after the first one every call returns false and error() says what and where.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace k3 {

class JsonStream {
 public:
  // Copies the next bytes of the document into `buf`; returns how many (0 only at the end).
  using Refill = std::function<absl::StatusOr<size_t>(std::span<char> buf)>;

  // The whole document in memory.
  explicit JsonStream(std::string_view text);
  // A document of `size` bytes read through `refill`, `window.size()` bytes at a time.
  JsonStream(uint64_t size, Refill refill, std::span<char> window);

  enum class Type { kObject, kArray, kString, kNumber, kLiteral, kEnd, kInvalid };
  // The type of the next value, by its first byte (after whitespace).
  Type Peek();

  // '{': then NextMember() until it returns false at '}'.
  bool BeginObject();
  // Reads the next key and its ':'; false at the closing brace (or on error: check ok()).
  bool NextMember(std::string& key);
  // '[': then NextElement() until it returns false at ']'.
  bool BeginArray();
  bool NextElement();

  bool ReadString(std::string& out);
  // Any number; *is_unsigned says whether it is a non-negative integer that fits 64 bits, and
  // then *value holds it (the rule nlohmann applies for is_number_unsigned).
  bool ReadNumber(uint64_t* value, bool* is_unsigned);
  // Any value, validated and discarded.
  bool SkipValue();
  // Nothing but whitespace may follow the top-level value (or a NUL byte, and then anything:
  // nlohmann's rule, which earlier versions of k3 applied to headers).
  bool Finish();

  bool ok() const { return error_.empty(); }
  // "at byte N: expected ..." (byte offsets count from the start of the document).
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    bool object;
    bool first;
  };
  bool More() { return p_ < end_ || Fill(); }
  bool Fill();
  bool Fail(std::string_view what);
  bool SkipSpace();
  bool Expect(char c, std::string_view what);
  bool ReadEscape(std::string& out);
  bool ReadUtf8(std::string& out);
  bool ReadLiteral(std::string_view word);
  bool NextInFrame(bool object);
  uint64_t Offset() const { return consumed_ + static_cast<uint64_t>(p_ - begin_); }

  const char* begin_ = nullptr;  // the window's first byte
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  uint64_t consumed_ = 0;   // document bytes before begin_
  uint64_t remaining_ = 0;  // bytes refill has yet to deliver
  Refill refill_;
  std::span<char> window_;
  std::vector<Frame> frames_;
  std::string number_;  // the text of the number being read
  std::string error_;
};

}  // namespace k3
