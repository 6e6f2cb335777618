// The file `k3 chat --history` keeps: the messages and every token id of the conversation, with
// the fingerprint of the model it belongs to. Parsed as a whole before anything is used, so a
// damaged file is refused (and left untouched) rather than half-loaded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace k3::cli {

inline constexpr char kChatHistoryFormat[] = "k3-chat-history";
inline constexpr int kChatHistoryVersion = 1;

struct ChatHistory {
  nlohmann::json messages = nlohmann::json::array();  // [{"role": ..., "content": ...}]
  std::vector<int32_t> tokens;
};

// InvalidArgument naming `path` and what is wrong for anything but a well-formed history whose
// token ids are below `vocab_size`; FailedPrecondition for one saved with another model.
absl::StatusOr<ChatHistory> ParseChatHistory(std::string_view text, const std::string& path,
                                             const std::string& fingerprint, int64_t vocab_size);
std::string SerializeChatHistory(const ChatHistory& history, const std::string& fingerprint);

}  // namespace k3::cli
