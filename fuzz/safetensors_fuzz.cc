// The safetensors header parser on arbitrary shard files: the input is the whole file (8-byte
// length prefix, JSON header, data). Whatever the bytes, the parser must either refuse them
// with DataLoss or return tensors that fit inside the file without overlapping.
//
// Its verdict on the JSON must also be nlohmann's, whose strict parser k3 used before simdjson
// On-Demand (which checks only what it is asked to read; core/checkpoint/json_reader.h checks the rest): a
// header it opens is valid JSON, and one it calls "not valid JSON" is not. Text after a NUL
// byte does not count, for either.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/checkpoint/safetensors.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint8_t prefix[8] = {};
  for (size_t i = 0; i < 8 && i < size; ++i) prefix[i] = data[i];
  auto length = k3::ParseHeaderLength(prefix, size, "fuzz.safetensors");
  if (!length.ok()) return 0;
  std::string_view header(reinterpret_cast<const char*>(data) + 8, *length);
  const bool valid_json = nlohmann::json::accept(header.substr(0, header.find('\0')));
  auto tensors = k3::ParseSafetensorsHeader(header, size, /*shard=*/0, "fuzz.safetensors");
  if (!tensors.ok()) {
    if (tensors.status().code() != absl::StatusCode::kDataLoss) std::abort();
    constexpr std::string_view kInvalid =
        "fuzz.safetensors: corrupt safetensors header: header is not valid JSON (";
    const bool called_invalid = std::string(tensors.status().message()).starts_with(kInvalid);
    if (called_invalid && valid_json) std::abort();
    return 0;
  }
  if (!valid_json) std::abort();
  uint64_t end = 0;
  for (const k3::TensorInfo& t : *tensors) {
    // Sorted, disjoint, inside the data section, and the size agrees with shape and dtype.
    if (t.file_offset < 8 + *length || t.file_offset < end) std::abort();
    if (t.byte_size > size || t.file_offset > size - t.byte_size) std::abort();
    if (static_cast<uint64_t>(t.elements()) * k3::DTypeSize(t.dtype) != t.byte_size) std::abort();
    end = t.file_offset + t.byte_size;
  }
  return 0;
}
