// The answer of Anthropic's Messages API, built from a reply's pieces as they come: content
// blocks in order (thinking, text, tool_use), each opened, added to and closed. The one
// sequence gives both the events of a stream (message_start, content_block_start / _delta /
// _stop, message_delta, message_stop) and the whole message, so that a stream and a plain
// answer of the same tokens hold the same blocks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tools/turn_parser.h"
#include "nlohmann/json.hpp"

namespace k3::server {

// The usage object of a message, counted as Anthropic counts it: input_tokens the prompt tokens
// that ran, cache_read_input_tokens those the prompt cache supplied (together the whole prompt,
// what count_tokens gives).
struct MessageUsage {
  int64_t input_tokens = 0, output_tokens = 0, cache_read_input_tokens = 0;
  nlohmann::ordered_json ToJson() const;
};

class MessageBuilder {
 public:
  // `thinking`: the request enabled thinking, so the message opens with a thinking block.
  MessageBuilder(std::string id, std::string model, bool thinking);

  // Each returns the SSE events of what it adds ("event: NAME\ndata: JSON\n\n" each).
  std::string Start(const MessageUsage& usage);
  std::string Add(std::string_view reasoning, std::string_view content,
                  const std::vector<ToolCall>& calls);
  // `stop_reason`: end_turn, max_tokens, stop_sequence (with the string) or tool_use.
  std::string Finish(const std::string& stop_reason, const std::optional<std::string>& stop,
                     const MessageUsage& usage);

  // The message so far (whole after Finish).
  const nlohmann::ordered_json& message() const { return message_; }

 private:
  // Closes the open block unless it is of `type`, then opens `block` (of that type) if needed.
  std::string Enter(const std::string& type, nlohmann::ordered_json block);
  std::string Close();
  std::string Delta(nlohmann::ordered_json delta);

  // Ordered: a tool_use's input keeps the order the model gave its arguments in, which the
  // next turn renders them in.
  nlohmann::ordered_json message_;
  bool thinking_;
  std::string open_;  // the type of the open block; empty for none
};

// "toolu_" and the call's own id (Anthropic's clients expect the prefix).
std::string ToolUseId(const std::string& call_id);
// The opaque signature of a thinking block: a digest of its text.
std::string ThinkingSignature(std::string_view thinking);

}  // namespace k3::server
