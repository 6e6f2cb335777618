#include "apps/server/anthropic_reply.h"

#include "absl/strings/str_cat.h"
#include "apps/server/event_stream.h"
#include "apps/server/http_internal.h"

namespace k3::server {

namespace {

// Ordered, as the message is (anthropic_reply.h).
using Json = nlohmann::ordered_json;

std::string Event(std::string_view name, const Json& data) {
  return FrameEvent(name, DumpOrdered(data));
}

// A call's arguments as the object a tool_use's input is; text that is not one (only a tool
// declared with strict false can give it) as an empty object rather than a broken block.
Json Input(const ToolCall& call) {
  Json input = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : Json::object();
}

}  // namespace

Json MessageUsage::ToJson() const {
  return {{"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"cache_read_input_tokens", cache_read_input_tokens},
          {"cache_creation_input_tokens", 0}};
}

std::string ToolUseId(const std::string& call_id) {
  const std::string prefix = "call_";
  return "toolu_" + (call_id.starts_with(prefix) ? call_id.substr(prefix.size()) : call_id);
}

std::string ThinkingSignature(std::string_view thinking) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const unsigned char c : thinking) h = (h ^ c) * 1099511628211ull;
  return absl::StrCat("k3-", absl::Hex(h, absl::kZeroPad16));
}

MessageBuilder::MessageBuilder(std::string id, std::string model, bool thinking)
    : message_({{"id", std::move(id)},
                {"type", "message"},
                {"role", "assistant"},
                {"model", std::move(model)},
                {"content", Json::array()},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage", MessageUsage{}.ToJson()}}),
      thinking_(thinking) {}

std::string MessageBuilder::Start(const MessageUsage& usage) {
  message_["usage"] = usage.ToJson();
  std::string out = Event("message_start", {{"type", "message_start"}, {"message", message_}});
  if (thinking_)
    out += Enter("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
  return out;
}

std::string MessageBuilder::Add(std::string_view reasoning, std::string_view content,
                                const std::vector<ToolCall>& calls) {
  std::string out;
  if (!reasoning.empty()) {
    out += Enter("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    message_["content"].back()["thinking"] =
        message_["content"].back()["thinking"].get<std::string>() + std::string(reasoning);
    out += Delta({{"type", "thinking_delta"}, {"thinking", reasoning}});
  }
  if (!content.empty()) {
    out += Enter("text", {{"type", "text"}, {"text", ""}});
    message_["content"].back()["text"] =
        message_["content"].back()["text"].get<std::string>() + std::string(content);
    out += Delta({{"type", "text_delta"}, {"text", content}});
  }
  for (const ToolCall& call : calls) {
    out += Close();  // each call a block of its own
    out += Enter("tool_use", {{"type", "tool_use"},
                              {"id", ToolUseId(call.id)},
                              {"name", call.name},
                              {"input", Json::object()}});
    const Json input = Input(call);
    message_["content"].back()["input"] = input;
    out += Delta({{"type", "input_json_delta"}, {"partial_json", DumpOrdered(input)}});
    out += Close();
  }
  return out;
}

std::string MessageBuilder::Finish(const std::string& stop_reason,
                                   const std::optional<std::string>& stop,
                                   const MessageUsage& usage) {
  std::string out = Close();
  message_["stop_reason"] = stop_reason;
  message_["stop_sequence"] = stop ? Json(*stop) : Json(nullptr);
  message_["usage"] = usage.ToJson();
  out += Event(
      "message_delta",
      {{"type", "message_delta"},
       {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", message_["stop_sequence"]}}},
       {"usage", message_["usage"]}});
  out += Event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string MessageBuilder::Enter(const std::string& type, Json block) {
  if (open_ == type) return "";
  std::string out = Close();
  message_["content"].push_back(block);
  open_ = type;
  out += Event("content_block_start", {{"type", "content_block_start"},
                                       {"index", message_["content"].size() - 1},
                                       {"content_block", std::move(block)}});
  return out;
}

std::string MessageBuilder::Close() {
  if (open_.empty()) return "";
  std::string out;
  Json& block = message_["content"].back();
  // The signature comes last, once the thinking text is whole, as the API sends it.
  if (open_ == "thinking") {
    block["signature"] = ThinkingSignature(block["thinking"].get<std::string>());
    out += Delta({{"type", "signature_delta"}, {"signature", block["signature"]}});
  }
  out += Event("content_block_stop",
               {{"type", "content_block_stop"}, {"index", message_["content"].size() - 1}});
  open_.clear();
  return out;
}

std::string MessageBuilder::Delta(Json delta) {
  return Event("content_block_delta", {{"type", "content_block_delta"},
                                       {"index", message_["content"].size() - 1},
                                       {"delta", std::move(delta)}});
}

}  // namespace k3::server
