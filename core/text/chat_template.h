// Kimi K3's chat format (XTML, ../shared/spec/TOOLS.md sections 1-8), as the release's own
// renderer builds it: a list of segments, each a structural marker (one of the four special
// tokens) or ordinary text that is BPE-encoded alone, with special tokens disabled, so a user
// typing "<|open|>" gets the characters, not the marker.
//
//   <|open|>message role="user"<|sep|>Hello<|close|>message<|sep|><|end_of_msg|>
//   <|open|>message role="assistant"<|sep|><|open|>think<|sep|>...<|close|>think<|sep|>
//     <|open|>response<|sep|>Hi!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>
//   generation prompt: <|open|>message role="assistant"<|sep|><|open|>think<|sep|>
//                      (thinking off: ...<|open|>response<|sep|>)
//
// A tag's name and each attribute are separate segments (` role`, `="`, `user`, `"`): joined,
// some texts encode to other ids.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/text/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace k3 {

// A call in an assistant message of the history.
struct ChatToolCall {
  std::string id;  // matched by the tool messages' tool_call_id; never rendered
  std::string name;
  // The OpenAI `arguments`: a string (rendered by the reference's one-level parse, literals
  // kept), an object (one argument per key, in its order), or null (no arguments).
  nlohmann::ordered_json arguments;
};

struct ChatMessage {
  std::string role;      // "system", "user", "assistant" or "tool"
  std::string content;   // for the assistant: the response
  std::string thinking;  // assistant only: the think channel (rendered when not empty)
  // Content given as a list of text parts: one segment each, in place of `content`.
  std::vector<std::string> parts;
  // system, user, assistant: name="..." when not empty. tool: the function whose result this
  // is (empty: the call at the same place in the latest assistant message).
  std::string name;
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: orders a run of results as the calls were made
  // system: tools declared in the middle of the conversation (an array; null for none).
  nlohmann::json tools;
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // The head of a conversation: the tool declaration and the thinking-effort message. A chat
  // that continues its own state renders only the new messages (false).
  bool head = true;
  bool thinking = true;                 // off: no think channels, the prompt opens `response`
  std::string thinking_effort = "max";  // low, high or max (only with thinking)
  nlohmann::json tools = nlohmann::json::array();  // the declared tools (client objects)
  // "required" and "none" render a tool-choice message when tools are declared; anything
  // else (auto, a named function) renders nothing.
  std::string tool_choice;
};

// A piece of the render: a special token by name, or text encoded on its own.
struct ChatSegment {
  std::string text;
  bool special = false;
  bool operator==(const ChatSegment&) const = default;
};

// The segments of the conversation. InvalidArgument naming the message for an unknown role,
// a call without a name, a tool result whose function cannot be told, or a bad effort.
absl::StatusOr<std::vector<ChatSegment>> RenderChatSegments(std::span<const ChatMessage> messages,
                                                            const ChatOptions& options = {});

// Token ids of the conversation. FailedPrecondition when the tokenizer lacks the XTML
// special tokens.
absl::StatusOr<std::vector<TokenId>> RenderChat(const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                const ChatOptions& options = {});

// The same conversation as text (special tokens by name), for display and tests.
absl::StatusOr<std::string> RenderChatText(std::span<const ChatMessage> messages,
                                           const ChatOptions& options = {});

// Encodes segments: special ones by id, text with special tokens disabled.
absl::StatusOr<std::vector<TokenId>> EncodeSegments(const Tokenizer& tokenizer,
                                                    std::span<const ChatSegment> segments);

}  // namespace k3
