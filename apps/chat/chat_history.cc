#include "apps/chat/chat_history.h"

#include "absl/strings/str_cat.h"

namespace k3::cli {
namespace {

using json = nlohmann::json;

absl::Status Corrupt(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--history ", path, ": ", std::string(what),
                                                 " (not a k3 chat history; left untouched)"));
}

}  // namespace

absl::StatusOr<ChatHistory> ParseChatHistory(std::string_view text, const std::string& path,
                                             const std::string& fingerprint, int64_t vocab_size) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    return Corrupt(path, absl::StrCat("invalid JSON at byte ", e.byte));
  } catch (const json::exception& e) {  // e.g. a number too large for any type
    return Corrupt(path, absl::StrCat("invalid JSON: ", e.what()));
  }
  if (!root.is_object() || !root.contains("format") || root["format"] != kChatHistoryFormat) {
    return Corrupt(path, absl::StrCat("no \"format\": \"", kChatHistoryFormat, "\""));
  }
  if (!root.contains("version") || root["version"] != kChatHistoryVersion) {
    return Corrupt(path,
                   absl::StrCat("unsupported version (this k3 reads ", kChatHistoryVersion, ")"));
  }
  if (!root.contains("model_fingerprint") || !root["model_fingerprint"].is_string()) {
    return Corrupt(path, "\"model_fingerprint\" missing");
  }
  const std::string theirs = root["model_fingerprint"].get<std::string>();
  if (theirs != fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("--history ", path, ": saved with another model (fingerprint ", theirs,
                     ", this model is ", fingerprint, "); left untouched"));
  }
  ChatHistory h;
  if (!root.contains("messages") || !root["messages"].is_array()) {
    return Corrupt(path, "\"messages\" is not an array");
  }
  for (const json& m : root["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return Corrupt(path, "a message without a string \"role\" and \"content\"");
    }
  }
  h.messages = root["messages"];
  if (!root.contains("tokens") || !root["tokens"].is_array()) {
    return Corrupt(path, "\"tokens\" is not an array");
  }
  for (const json& id : root["tokens"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
      return Corrupt(path, absl::StrCat("\"tokens\" holds ", id.dump(), ", not a token id below ",
                                        vocab_size));
    }
    h.tokens.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return h;
}

std::string SerializeChatHistory(const ChatHistory& history, const std::string& fingerprint) {
  const json root = {{"format", kChatHistoryFormat},
                     {"version", kChatHistoryVersion},
                     {"model_fingerprint", fingerprint},
                     {"messages", history.messages},
                     {"tokens", history.tokens}};
  // A reply may end inside a UTF-8 character: saved as U+FFFD, not a crash (the tokens are exact).
  return root.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace k3::cli
