// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON mapping
// tensor names to {dtype, shape, data_offsets}, then the data (offsets relative to 8 + N).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

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

// Headers larger than this are refused as corrupt (a real shard's header is well under 1 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Reads the 8-byte length prefix; checks it against the file size.
absl::StatusOr<uint64_t> ParseHeaderLength(const uint8_t prefix[8], uint64_t file_size,
                                           std::string_view file_name);

// Parses and checks the JSON header of a file of `file_size` bytes whose header is
// `header_json` (N bytes). Tensors come back sorted by offset, with `shard` set to `shard`.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(std::string_view header_json,
                                                               uint64_t file_size, int shard,
                                                               std::string_view file_name);

// Serialises a header for tensors laid out back to back in the given order (offsets are
// assigned here); the result includes the 8-byte prefix and is padded to 8 bytes.
std::string BuildSafetensorsHeader(const std::vector<TensorInfo>& tensors);

}  // namespace k3
