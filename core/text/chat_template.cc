#include "core/text/chat_template.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/text/tools/python_json.h"

namespace k3 {
namespace {

using Attributes = std::vector<std::pair<std::string, std::string>>;

constexpr const char* kEffortBody =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the "
    "system is invoked with `thinking_effort=";
constexpr const char* kDeclareBody =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr const char* kDynamicDeclareBody =
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\nYou "
    "have access to all existing and extended tools.\nHere are the specs for the extended "
    "tools.\n\n```json\n";

std::string EscapeAttribute(const std::string& value) {
  return absl::StrReplaceAll(value, {{"&", "&amp;"}, {"\"", "&quot;"}});
}

// The reference's _segment, _open_tag, _attr and _close_tag.
class Builder {
 public:
  void Special(const char* name) { segments_.push_back({name, true}); }
  void Text(std::string text) {
    if (!text.empty()) segments_.push_back({std::move(text), false});
  }
  void Open(const std::string& tag, const Attributes& attributes = {}) {
    Special("<|open|>");
    Text(tag);
    for (const auto& [key, value] : attributes) {
      Text(" " + key);
      Text("=\"");
      Text(EscapeAttribute(value));
      Text("\"");
    }
    Special("<|sep|>");
  }
  void Close(const std::string& tag) {
    Special("<|close|>");
    Text(tag);
    Special("<|sep|>");
  }
  void EndMessage() {
    Close("message");
    Special("<|end_of_msg|>");
  }
  // _internal: a system message of a kind, its body stripped.
  void Internal(const std::string& kind, std::string_view body) {
    Open("message", {{"role", "system"}, {"type", kind}});
    const size_t first = body.find_first_not_of(" \t\n\r\f\v");
    const size_t last = body.find_last_not_of(" \t\n\r\f\v");
    if (first != std::string_view::npos) Text(std::string(body.substr(first, last - first + 1)));
    EndMessage();
  }
  void Declaration(const char* preamble, const nlohmann::json& tools) {
    Open("message", {{"role", "system"}, {"type", "tool-declare"}});
    Text(absl::StrCat(preamble, PythonJsonDumps(tools, /*compact=*/true), "\n```"));
    EndMessage();
  }
  void Content(const ChatMessage& m) {
    if (m.parts.empty()) {
      Text(m.content);
    } else {
      for (const std::string& part : m.parts) Text(part);
    }
  }
  std::vector<ChatSegment>& segments() { return segments_; }

 private:
  std::vector<ChatSegment> segments_;
};

// _xtml_type of a JSON value.
const char* XtmlType(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

void Argument(Builder& b, const std::string& key, const std::string& type,
              const std::string& value) {
  b.Open("argument", {{"key", key}, {"type", type}});
  b.Text(value);
  b.Close("argument");
}

// normalize_tool_arguments: an object's keys in order, a string by the one-level parse (or
// verbatim in a json block), nothing for null or "".
absl::Status Arguments(Builder& b, const nlohmann::ordered_json& args, const std::string& where) {
  if (args.is_null() || (args.is_string() && args.get<std::string>().empty())) {
    return absl::OkStatus();
  }
  if (args.is_object()) {
    for (auto it = args.begin(); it != args.end(); ++it) {
      const auto& v = it.value();
      Argument(b, it.key(), XtmlType(v),
               v.is_string() ? v.get<std::string>() : PythonJsonDumps(v, /*compact=*/false));
    }
    return absl::OkStatus();
  }
  if (!args.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".arguments must be a string or an object"));
  }
  const std::string text = args.get<std::string>();
  if (auto pairs = ParseArgumentsOneLevel(text)) {
    for (const ArgumentPair& p : *pairs) Argument(b, p.key, p.type, p.value);
    return absl::OkStatus();
  }
  b.Open("json", {{"type", "object"}});
  b.Text(text);
  b.Close("json");
  return absl::OkStatus();
}

absl::Status Assistant(Builder& b, const ChatMessage& m, bool thinking, const std::string& where) {
  Attributes attributes = {{"role", "assistant"}};
  if (!m.name.empty()) attributes.push_back({"name", m.name});
  b.Open("message", attributes);
  if (thinking) {
    b.Open("think");
    b.Text(m.thinking);
    b.Close("think");
  }
  b.Open("response");
  b.Content(m);
  b.Close("response");
  if (!m.tool_calls.empty()) {
    b.Open("tools");
    for (size_t i = 0; i < m.tool_calls.size(); ++i) {
      const ChatToolCall& call = m.tool_calls[i];
      const std::string call_where = absl::StrCat(where, ".tool_calls[", i, "]");
      if (call.name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(call_where, " has no function name"));
      }
      b.Open("call", {{"tool", call.name}, {"index", absl::StrCat(i + 1)}});
      if (absl::Status s = Arguments(b, call.arguments, call_where + ".function"); !s.ok()) {
        return s;
      }
      b.Close("call");
    }
    b.Close("tools");
  }
  b.EndMessage();
  return absl::OkStatus();
}

// normalize_xtml_tool_result_messages: a run of tool results that all name calls of the latest
// assistant message is put in the order of those calls and takes their function names.
std::vector<ChatMessage> ReorderToolResults(std::span<const ChatMessage> messages) {
  std::vector<ChatMessage> out(messages.begin(), messages.end());
  std::map<std::string, std::pair<size_t, std::string>> calls;  // id -> (position, name)
  for (size_t i = 0; i < out.size();) {
    if (out[i].role == "assistant") {
      calls.clear();
      for (size_t c = 0; c < out[i].tool_calls.size(); ++c) {
        const ChatToolCall& call = out[i].tool_calls[c];
        calls.emplace(call.id, std::make_pair(c + 1, call.name));  // the first id wins
      }
    }
    if (out[i].role != "tool") {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < out.size() && out[end].role == "tool") ++end;
    const bool all_match = std::all_of(out.begin() + i, out.begin() + end, [&](const auto& m) {
      return !m.tool_call_id.empty() && calls.count(m.tool_call_id) > 0;
    });
    if (all_match) {
      std::stable_sort(out.begin() + i, out.begin() + end, [&](const auto& x, const auto& y) {
        return calls[x.tool_call_id].first < calls[y.tool_call_id].first;
      });
      for (size_t k = i; k < end; ++k) out[k].name = calls[out[k].tool_call_id].second;
    }
    i = end;
  }
  return out;
}

bool DeclaresTools(std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (options.tools.is_array() && !options.tools.empty()) return true;
  return std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) {
    return m.role == "system" && m.tools.is_array() && !m.tools.empty();
  });
}

absl::Status Messages(Builder& b, std::span<const ChatMessage> original, bool thinking) {
  const std::vector<ChatMessage> messages = ReorderToolResults(original);
  const ChatMessage* last_assistant = nullptr;
  size_t results = 0;  // tool messages since the latest assistant message
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (m.role == "assistant") {
      if (absl::Status s = Assistant(b, m, thinking, where); !s.ok()) return s;
      last_assistant = &m;
      results = 0;
    } else if (m.role == "tool") {
      ++results;
      std::string name = m.name;
      if (name.empty() && last_assistant != nullptr &&
          results <= last_assistant->tool_calls.size()) {
        name = last_assistant->tool_calls[results - 1].name;
      }
      if (name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": a tool result whose function is unknown (no name, and no call ",
                         results, " in the assistant message before it)"));
      }
      b.Open("message", {{"role", "tool"}, {"tool", name}, {"index", absl::StrCat(results)}});
      b.Content(m);
      b.EndMessage();
    } else if (m.role == "system" && m.tools.is_array() && !m.tools.empty()) {
      b.Declaration(kDynamicDeclareBody, m.tools);
    } else if (m.role == "system" || m.role == "user") {
      Attributes attributes = {{"role", m.role}};
      if (!m.name.empty()) attributes.push_back({"name", m.name});
      b.Open("message", attributes);
      b.Content(m);
      b.EndMessage();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown chat role \"", m.role, "\" in ", where));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<ChatSegment>> RenderChatSegments(std::span<const ChatMessage> messages,
                                                            const ChatOptions& options) {
  const std::string& effort = options.thinking_effort;
  if (options.thinking && effort != "low" && effort != "high" && effort != "max") {
    return absl::InvalidArgumentError(
        absl::StrCat("thinking effort \"", effort, "\" is not one of low, high and max"));
  }
  Builder b;
  if (options.head) {
    if (options.tools.is_array() && !options.tools.empty()) {
      b.Declaration(kDeclareBody, options.tools);
    }
    if (options.thinking) b.Internal("thinking-effort", absl::StrCat(kEffortBody, effort, "`."));
  }
  if (absl::Status s = Messages(b, messages, options.thinking); !s.ok()) return s;
  if (DeclaresTools(messages, options) &&
      (options.tool_choice == "required" || options.tool_choice == "none")) {
    const bool required = options.tool_choice == "required";
    b.Internal("tool-choice",
               absl::StrCat("The system is invoked with `tool_choice=", options.tool_choice,
                            "`.\nYou MUST ", required ? "call tools" : "NOT call any tools",
                            " in the next message."));
  }
  if (options.add_generation_prompt) {
    b.Open("message", {{"role", "assistant"}});
    b.Open(options.thinking ? "think" : "response");
  }
  return std::move(b.segments());
}

absl::StatusOr<std::vector<TokenId>> EncodeSegments(const Tokenizer& tokenizer,
                                                    std::span<const ChatSegment> segments) {
  std::vector<TokenId> ids;
  for (const ChatSegment& s : segments) {
    if (s.special) {
      auto id = tokenizer.SpecialTokenId(s.text);
      if (!id.has_value()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the tokenizer has no special token ", s.text,
                         " (the chat template needs the Kimi K3 special tokens)"));
      }
      ids.push_back(*id);
    } else {
      std::vector<TokenId> text = tokenizer.Encode(s.text, /*allow_special=*/false);
      ids.insert(ids.end(), text.begin(), text.end());
    }
  }
  return ids;
}

absl::StatusOr<std::vector<TokenId>> RenderChat(const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                const ChatOptions& options) {
  auto segments = RenderChatSegments(messages, options);
  if (!segments.ok()) return segments.status();
  return EncodeSegments(tokenizer, *segments);
}

absl::StatusOr<std::string> RenderChatText(std::span<const ChatMessage> messages,
                                           const ChatOptions& options) {
  auto segments = RenderChatSegments(messages, options);
  if (!segments.ok()) return segments.status();
  std::string out;
  for (const ChatSegment& s : *segments) out += s.text;
  return out;
}

}  // namespace k3
