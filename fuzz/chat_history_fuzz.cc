// The `k3 chat --history` file on arbitrary bytes. A history it accepts must hold only token ids
// below the vocabulary and string messages, and must save back to a file that parses to the same
// conversation (what a resumed chat relies on).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "apps/chat/chat_history.h"

namespace {
constexpr char kFingerprint[] = "fuzz-model";
constexpr int64_t kVocab = 300;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto h = k3::cli::ParseChatHistory(text, "h.json", kFingerprint, kVocab);
  if (!h.ok()) {
    const auto code = h.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {
      std::abort();
    }
    return 0;
  }
  for (int32_t id : h->tokens) {
    if (id < 0 || id >= kVocab) std::abort();
  }
  auto again = k3::cli::ParseChatHistory(k3::cli::SerializeChatHistory(*h, kFingerprint), "again",
                                         kFingerprint, kVocab);
  if (!again.ok() || again->tokens != h->tokens || again->messages != h->messages) std::abort();
  return 0;
}
