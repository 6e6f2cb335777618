// The streaming JSON reader that opens checkpoints (core/json_stream.h) against nlohmann's
// strict parser: on any input it must accept exactly what nlohmann accepts, whether the text
// is in memory or arrives through a 3-byte window (every token then straddles a refill).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "core/json_stream.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const bool expected = nlohmann::json::accept(text);
  k3::JsonStream in_memory(text);
  if ((in_memory.SkipValue() && in_memory.Finish()) != expected) std::abort();
  std::vector<char> window(3);
  size_t next = 0;
  k3::JsonStream windowed(
      size,
      [&](std::span<char> out) -> absl::StatusOr<size_t> {
        std::memcpy(out.data(), text.data() + next, out.size());
        next += out.size();
        return out.size();
      },
      window);
  if ((windowed.SkipValue() && windowed.Finish()) != expected) std::abort();
  return 0;
}
