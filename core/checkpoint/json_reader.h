// Large JSON documents read with simdjson On-Demand: the safetensors headers (the release's
// language model in one file has a 77.6 MB one) and model.safetensors.index.json (59.8 MB).
// A DOM costs several times the document in memory, and memory touched for the first time is
// slow on the machines measured (docs/CHECKPOINT.md); On-Demand keeps the text and one index of
// its structural characters, and hands values over in document order.
//
// On-Demand checks only what it is asked to read, so the readers here check the rest: Skip()
// validates every part of a value it discards (strings with their escapes, numbers, literals,
// nesting) and Finish() refuses anything after the top-level value. A document is accepted
// only if it is valid JSON as nlohmann's strict parser, which k3 used before, decides; with its
// extensions (a NUL byte ends the document, so headers padded with NULs open; a leading byte
// order mark is skipped), and with nlohmann deciding the few numbers and top-level scalars
// where simdjson 3.0 differs. fuzz/safetensors_fuzz.cc holds it to that.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "io/aligned_buffer.h"
#include "io/file.h"

// simdjson adds members to its parser where __OPTIMIZE__ is undefined (its "development
// checks"): a file compiled at -O0 (the test programs in the sanitizer builds) and one at -O1
// would disagree on JsonReader's size, and the linker keeps one copy of its inline constructor.
// One layout everywhere.
#ifndef SIMDJSON_DEVELOPMENT_CHECKS
#define SIMDJSON_DEVELOPMENT_CHECKS 0
#endif
#include "simdjson.h"

namespace k3 {

class JsonReader {
 public:
  // Nesting deeper than this is refused (no real header comes close): Skip() recurses.
  static constexpr int kMaxDepth = 512;

  JsonReader() = default;
  JsonReader(const JsonReader&) = delete;
  JsonReader& operator=(const JsonReader&) = delete;

  // Reads bytes [offset, offset + length) of `file` as the document. The memory (and the
  // parser's) is kept for the next document, which reuses it when it fits.
  absl::Status Load(const io::RandomAccessFile& file, uint64_t offset, uint64_t length);
  // Copies `text` as the document.
  absl::Status Load(std::string_view text);

  // The document from its first byte; a document can be read more than once.
  simdjson::error_code Start(simdjson::ondemand::document& doc);

  // A string (key or value) unescaped and checked; the view lives until the next call.
  simdjson::error_code String(simdjson::ondemand::raw_json_string raw, std::string_view& out);
  // A string value, the same way.
  simdjson::error_code String(simdjson::ondemand::value& value, std::string_view& out);
  // One member of an object being iterated: the field, its key (as String() gives it) and the
  // type of its value.
  simdjson::error_code Member(simdjson::simdjson_result<simdjson::ondemand::field> member,
                              simdjson::ondemand::field& field, std::string_view& key,
                              simdjson::ondemand::json_type& type);
  // A value validated and discarded.
  simdjson::error_code Skip(simdjson::ondemand::value value) { return SkipAt(value, 1); }
  // A number checked (some are valid that simdjson refuses); it may be left unconsumed.
  simdjson::error_code CheckNumber(simdjson::ondemand::value& value);
  // The whole document validated and discarded, from its first byte: for one that turned out
  // not to be what was expected, to say whether it is JSON at all.
  simdjson::error_code SkipDocument(simdjson::ondemand::document& doc);
  // After the top-level value: SUCCESS when nothing follows it but whitespace.
  simdjson::error_code Finish(simdjson::ondemand::document& doc);
  // "at byte N: what simdjson says", for an error met while reading `doc`.
  std::string Describe(simdjson::error_code error, simdjson::ondemand::document& doc);

  // The document as simdjson sees it (after a byte order mark, before a NUL).
  std::string_view text() const {
    return {reinterpret_cast<const char*>(data()) + begin_, length_};
  }

 private:
  absl::Status Reserve(uint64_t length);
  // Trims the document at its first NUL byte and fills the padding simdjson reads ahead into.
  void Seal(uint64_t length);
  simdjson::error_code SkipAt(simdjson::ondemand::value value, int depth);
  uint8_t* data() const { return buffer_ != nullptr ? buffer_->data() : small_.get(); }

  // The document: in huge pages when it is large (a 77.6 MB document in fresh 4 KiB pages
  // costs more to fault in than to parse), else on the heap (a huge page is 2 MiB to zero).
  std::unique_ptr<io::BufferArena> buffer_;
  std::unique_ptr<uint8_t[]> small_;
  size_t capacity_ = 0;
  size_t begin_ = 0;
  size_t length_ = 0;
  simdjson::ondemand::parser parser_;
  // Where String() unescapes to: as long as the document, since a string can be, but only
  // the longest string's pages are ever touched.
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratch_size_ = 0;
  bool started_ = false;  // the last Start() succeeded: the document has places to name
};

}  // namespace k3
