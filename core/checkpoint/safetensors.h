// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON mapping
// tensor names to {dtype, shape, data_offsets}, then the data (offsets relative to 8 + N).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "io/file.h"

namespace k3 {

enum class DType { kBF16, kF16, kF32, kU8 };

const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  int shard = 0;             // index into the checkpoint's shard list
  uint64_t file_offset = 0;  // absolute offset of the first byte in the shard file
  uint64_t byte_size = 0;

  int64_t elements() const;
};

// "[64, 128]", as messages print a shape.
std::string ShapeText(std::span<const int64_t> shape);

// Headers larger than this are refused as corrupt. A release shard's header is under 1 MB; the
// whole language model in one file has a 76 MB one.
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Reads the 8-byte length prefix; checks it against the file size.
absl::StatusOr<uint64_t> ParseHeaderLength(const uint8_t prefix[8], uint64_t file_size,
                                           std::string_view file_name);

// One tensor of a header, checked on its own: a supported dtype, a shape whose bytes match
// its data_offsets, and data inside the file. The views live until the next entry.
struct TensorEntry {
  std::string_view name;
  DType dtype = DType::kU8;
  std::span<const int64_t> shape;
  uint64_t file_offset = 0;  // absolute
  uint64_t byte_size = 0;
};

// Receives a header's tensors in the order it lists them. A sink keeps what it needs in its
// own form (a checkpoint of 497,052 tensors cannot afford a std::string per name), and it
// is the one that catches names listed twice, since it is the one that remembers names.
class SafetensorsSink {
 public:
  virtual ~SafetensorsSink() = default;
  virtual absl::Status Add(const TensorEntry& entry) = 0;
};

class JsonReader;

// Where a header's JSON comes from: memory, or the `length` bytes after the prefix of a file,
// read into `reader`, which keeps its memory for the next header (the header of a one-file
// release is 77.6 MB: a buffer and a parser allocated once cost less than one per file).
class HeaderSource {
 public:
  explicit HeaderSource(std::string_view json) : json_(json), length_(json.size()) {}
  HeaderSource(const io::RandomAccessFile& file, uint64_t length, JsonReader& reader)
      : file_(&file), length_(length), reader_(&reader) {}
  std::string_view json() const { return json_; }
  const io::RandomAccessFile* file() const { return file_; }
  uint64_t length() const { return length_; }
  JsonReader* reader() const { return reader_; }

 private:
  std::string_view json_;
  const io::RandomAccessFile* file_ = nullptr;
  uint64_t length_ = 0;
  JsonReader* reader_ = nullptr;
};

// Parses and checks a header of a file of `file_size` bytes, passing each tensor to `sink`,
// and checks that no two tensors overlap. Errors are DataLoss and start with `file_name`, but
// for a read that fails, which returns the file's own error (it names the file too).
absl::Status ScanSafetensorsHeader(const HeaderSource& header, uint64_t file_size,
                                   std::string_view file_name, SafetensorsSink& sink);

// The same for small headers and tools: every tensor as a TensorInfo (names listed twice
// refused), sorted by offset, with `shard` set to `shard`.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(std::string_view header_json,
                                                               uint64_t file_size, int shard,
                                                               std::string_view file_name);

// Serialises a header for tensors laid out back to back in the given order (offsets are
// assigned here); the result includes the 8-byte prefix and is padded to 8 bytes. The text is
// what nlohmann's dump() writes, built directly: a map-based JSON object is quadratic in the
// number of keys when it keeps their order.
std::string BuildSafetensorsHeader(const std::vector<TensorInfo>& tensors);

// `s` as a JSON string literal, quotes included (as nlohmann's dump() escapes it).
std::string JsonQuote(std::string_view s);

}  // namespace k3
