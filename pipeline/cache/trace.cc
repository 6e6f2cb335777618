#include "pipeline/cache/trace.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "io/file.h"

namespace k3 {
namespace {

constexpr size_t kPairBytes = 8;

int32_t LoadLittleEndian32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return static_cast<int32_t>(v);
}

void StoreLittleEndian32(int32_t value, std::string& out) {
  const uint32_t v = static_cast<uint32_t>(value);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

absl::StatusOr<std::vector<ExpertKey>> ParseExpertTrace(std::string_view bytes,
                                                        std::string_view name) {
  if (bytes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("trace ", std::string(name), " is empty"));
  }
  if (bytes.size() % kPairBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace ", std::string(name), " is ", bytes.size(),
        " bytes, not a multiple of 8 (each request is a little-endian int32 pair: layer, expert)"));
  }
  std::vector<ExpertKey> trace(bytes.size() / kPairBytes);
  for (size_t i = 0; i < trace.size(); ++i) {
    const char* p = bytes.data() + i * kPairBytes;
    trace[i] = {LoadLittleEndian32(p), LoadLittleEndian32(p + 4)};
    if (trace[i].layer < 0 || trace[i].expert < 0) {
      return absl::InvalidArgumentError(absl::StrCat("trace ", std::string(name), ": request ", i,
                                                     " (byte offset ", i * kPairBytes,
                                                     ") has a negative id: ", trace[i].ToString()));
    }
  }
  return trace;
}

absl::StatusOr<std::vector<ExpertKey>> ReadExpertTrace(const std::string& path) {
  absl::StatusOr<std::string> bytes = io::ReadFileToString(path);
  if (!bytes.ok()) {
    return absl::Status(bytes.status().code(),
                        absl::StrCat("cannot read trace: ", bytes.status().message()));
  }
  return ParseExpertTrace(*bytes, path);
}

std::string EncodeExpertTrace(const std::vector<ExpertKey>& trace) {
  std::string out;
  out.reserve(trace.size() * kPairBytes);
  for (const ExpertKey& k : trace) {
    StoreLittleEndian32(k.layer, out);
    StoreLittleEndian32(k.expert, out);
  }
  return out;
}

}  // namespace k3
