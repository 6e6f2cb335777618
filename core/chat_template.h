// The Kimi K3 chat template (XTML, MODEL.md 4.3): structural markers are special tokens;
// message text is encoded with special tokens disabled, so a user typing "<|open|>" gets the
// characters, not the marker.
//
//   <|open|>message role="user"<|sep|>Hello<|end_of_msg|>
//   <|open|>message role="assistant"<|sep|><|open|>think<|sep|>...<|close|>think<|sep|>
//     <|open|>response<|sep|>Hi!<|close|>response<|sep|><|end_of_msg|>
//   generation prompt: <|open|>message role="assistant"<|sep|><|open|>think<|sep|>
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"

namespace k3 {

struct ChatMessage {
  std::string role;      // "system", "user" or "assistant"
  std::string content;   // for the assistant: the response
  std::string thinking;  // assistant only: the think channel
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // When set, a first system message type="thinking-effort" carries it (e.g. "low").
  std::optional<std::string> thinking_effort;
};

// Token ids of the conversation. FailedPrecondition when the tokenizer lacks the XTML
// special tokens, InvalidArgument for an unknown role.
absl::StatusOr<std::vector<TokenId>> RenderChat(const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                const ChatOptions& options = {});

// The same conversation as text (special tokens by name), for display and tests.
absl::StatusOr<std::string> RenderChatText(std::span<const ChatMessage> messages,
                                           const ChatOptions& options = {});

}  // namespace k3
