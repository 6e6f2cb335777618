#include "apps/server/anthropic_request.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "apps/server/tool_request.h"

namespace k3::server {
namespace messages_api {
namespace {

// Ordered: a tool_use's input renders in the client's key order, and a schema's properties are
// generated in it.
using Json = nlohmann::ordered_json;
using Error = std::optional<ApiError>;

// The API names a field by its path, indices as keys ("messages.1.content.0.text").
std::string At(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", std::string(key));
}
std::string At(const std::string& path, size_t i) { return absl::StrCat(path, ".", i); }

ApiError Bad(std::string path, std::string text) {
  return InvalidField(std::move(path), std::move(text));
}

Error OnlyKnown(const Json& o, const std::string& path,
                std::initializer_list<std::string_view> ok) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (std::find(ok.begin(), ok.end(), it.key()) == ok.end()) {
      return Bad(At(path, it.key()), "Extra inputs are not permitted");
    }
  }
  return std::nullopt;
}

// An object whose "type" is a string: that type.
Error TypeOf(const Json& v, const std::string& path, std::string& type) {
  if (!v.is_object()) return Bad(path, "Input should be an object");
  if (!v.contains("type") || !v["type"].is_string()) {
    return Bad(At(path, "type"), "Field required (a string)");
  }
  type = v["type"].get<std::string>();
  return std::nullopt;
}

Error String(const Json& o, std::string_view key, const std::string& path, std::string& out,
             bool required = true) {
  const std::string k(key);
  if (!o.contains(k) || o[k].is_null()) {
    return required ? Error(Bad(At(path, key), "Field required")) : std::nullopt;
  }
  if (!o[k].is_string()) return Bad(At(path, key), "Input should be a valid string");
  out = o[k].get<std::string>();
  return std::nullopt;
}

Error Flag(const Json& o, std::string_view key, const std::string& path, bool& out) {
  const std::string k(key);
  if (!o.contains(k) || o[k].is_null()) return std::nullopt;
  if (!o[k].is_boolean()) return Bad(At(path, key), "Input should be a valid boolean");
  out = o[k].get<bool>();
  return std::nullopt;
}

Error Unsupported(const std::string& path, std::string_view what) {
  ApiError e = Bad(path, absl::StrCat(std::string(what), " is not supported by this server"));
  e.code = "unsupported_parameter";
  return e;
}

// A text block (cache_control and citations accepted and unused), appended to `m` as a part
// of its content (one segment each, as the OpenAI path reads a list of parts).
Error TextBlock(const Json& b, const std::string& path, ChatMessage& m) {
  if (auto e = OnlyKnown(b, path, {"type", "text", "cache_control", "citations"})) return e;
  std::string text;
  if (auto e = String(b, "text", path, text)) return e;
  m.content += text;
  m.parts.push_back(std::move(text));
  return std::nullopt;
}

// Calls `read(block, its path, its type)` for each block of a list.
template <typename Read>
Error EachBlock(const Json& blocks, const std::string& path, Read read) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::string type;
    if (auto e = TypeOf(blocks[i], At(path, i), type)) return e;
    if (auto e = read(blocks[i], At(path, i), type)) return e;
  }
  return std::nullopt;
}

// A string, or a list of text blocks.
Error TextContent(const Json& v, const std::string& path, ChatMessage& m) {
  if (v.is_string()) {
    m.content = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return Bad(path, "Input should be a string or a list of text blocks");
  return EachBlock(v, path, [&](const Json& b, const std::string& where, const std::string& type) {
    if (type != "text") return Unsupported(where, absl::StrCat("a '", type, "' block here"));
    return TextBlock(b, where, m);
  });
}

// The tool_use ids of the conversation so far and their tools.
using Calls = std::map<std::string, std::string>;

Error ToolResult(const Json& b, const std::string& path, const Calls& calls,
                 std::vector<ChatMessage>& out) {
  if (auto e = OnlyKnown(b, path, {"type", "tool_use_id", "content", "is_error", "cache_control"}))
    return e;
  ChatMessage m{.role = "tool"};
  if (auto e = String(b, "tool_use_id", path, m.tool_call_id)) return e;
  const auto call = calls.find(m.tool_call_id);
  if (call == calls.end()) {
    return Bad(At(path, "tool_use_id"),
               absl::StrCat("no earlier tool_use block has the id '", m.tool_call_id, "'"));
  }
  m.name = call->second;
  if (b.contains("content") && !b["content"].is_null()) {
    if (auto e = TextContent(b["content"], At(path, "content"), m)) return e;
  }
  // The result renders the same either way: the template has no place for the flag.
  bool is_error = false;
  if (auto e = Flag(b, "is_error", path, is_error)) return e;
  out.push_back(std::move(m));
  return std::nullopt;
}

// A user message's blocks: runs of text as user messages, each tool_result a tool message.
Error UserBlocks(const Json& blocks, const std::string& path, const Calls& calls,
                 std::vector<ChatMessage>& out) {
  ChatMessage text{.role = "user"};
  Error e = EachBlock(
      blocks, path, [&](const Json& b, const std::string& where, const std::string& type) -> Error {
        if (type == "text") return TextBlock(b, where, text);
        if (type != "tool_result") {
          return Unsupported(where,
                             absl::StrCat("a '", type, "' block (text and tool_result only)"));
        }
        if (!text.parts.empty()) out.push_back(std::exchange(text, ChatMessage{.role = "user"}));
        return ToolResult(b, where, calls, out);
      });
  if (!e && (!text.parts.empty() || blocks.empty())) out.push_back(std::move(text));
  return e;
}

Error ToolUse(const Json& b, const std::string& path, Calls& calls, ChatMessage& m) {
  if (auto e = OnlyKnown(b, path, {"type", "id", "name", "input", "cache_control"})) return e;
  ChatToolCall call;
  if (auto e = String(b, "id", path, call.id)) return e;
  if (auto e = String(b, "name", path, call.name)) return e;
  if (call.name.empty()) return Bad(At(path, "name"), "String should have at least 1 character");
  if (!b.contains("input") || !b["input"].is_object()) {
    return Bad(At(path, "input"), "Input should be an object");
  }
  call.arguments = b["input"];
  calls.emplace(call.id, call.name);
  m.tool_calls.push_back(std::move(call));
  return std::nullopt;
}

// An assistant message's blocks: text the response, thinking the reasoning, tool_use calls.
Error AssistantBlocks(const Json& blocks, const std::string& path, Calls& calls, ChatMessage& m) {
  return EachBlock(
      blocks, path, [&](const Json& b, const std::string& where, const std::string& type) -> Error {
        if (type == "text") return TextBlock(b, where, m);
        if (type == "tool_use") return ToolUse(b, where, calls, m);
        // Another server's encrypted reasoning: nothing this model can read.
        if (type == "redacted_thinking") return std::nullopt;
        if (type != "thinking") {
          return Unsupported(where, absl::StrCat("a '", type, "' block in an assistant message"));
        }
        if (auto e = OnlyKnown(b, where, {"type", "thinking", "signature", "cache_control"}))
          return e;
        std::string text;
        if (auto e = String(b, "thinking", where, text)) return e;
        m.thinking += text;
        return std::nullopt;
      });
}

Error Messages(const Json& j, std::vector<ChatMessage>& out) {
  if (!j.contains("messages")) return Bad("messages", "Field required");
  const Json& list = j["messages"];
  if (!list.is_array() || list.empty()) return Bad("messages", "Input should be a non-empty list");
  Calls calls;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = At("messages", i);
    const Json& m = list[i];
    if (!m.is_object()) return Bad(path, "Input should be an object");
    if (auto e = OnlyKnown(m, path, {"role", "content"})) return e;
    ChatMessage message;
    if (auto e = String(m, "role", path, message.role)) return e;
    if (message.role != "user" && message.role != "assistant") {
      return Bad(At(path, "role"), "Input should be 'user' or 'assistant'");
    }
    if (!m.contains("content")) return Bad(At(path, "content"), "Field required");
    const Json& content = m["content"];
    if (!content.is_string() && !content.is_array()) {
      return Bad(At(path, "content"), "Input should be a string or a list of blocks");
    }
    if (message.role == "assistant" && i + 1 == list.size()) {
      return Unsupported(path, "a final assistant message (a prefill to continue)");
    }
    if (content.is_string()) {
      message.content = content.get<std::string>();
      out.push_back(std::move(message));
    } else if (message.role == "user") {
      if (auto e = UserBlocks(content, At(path, "content"), calls, out)) return e;
    } else {
      if (auto e = AssistantBlocks(content, At(path, "content"), calls, message)) return e;
      out.push_back(std::move(message));
    }
  }
  return std::nullopt;
}

Error System(const Json& j, std::vector<ChatMessage>& out) {
  if (!j.contains("system") || j["system"].is_null()) return std::nullopt;
  ChatMessage system{.role = "system"};
  if (auto e = TextContent(j["system"], "system", system)) return e;
  out.push_back(std::move(system));
  return std::nullopt;
}

// Anthropic's tool definitions as OpenAI's, so that the declaration renders the same and
// server::ReadTools checks them; its errors are renamed to this API's fields.
Error Tools(const Json& j, CompletionRequest& r) {
  if (!j.contains("tools") || j["tools"].is_null()) return std::nullopt;
  if (!j["tools"].is_array()) return Bad("tools", "Input should be a list");
  Json tools = Json::array();
  for (size_t i = 0; i < j["tools"].size(); ++i) {
    const Json& t = j["tools"][i];
    const std::string path = At("tools", i);
    if (!t.is_object()) return Bad(path, "Input should be an object");
    if (t.contains("type") && t["type"] != "custom") {
      return Unsupported(At(path, "type"), "a server tool (client tools only)");
    }
    if (auto e = OnlyKnown(
            t, path, {"type", "name", "description", "input_schema", "cache_control", "strict"}))
      return e;
    Json function = Json::object();
    std::string name, description;
    if (auto e = String(t, "name", path, name)) return e;
    function["name"] = name;
    if (auto e = String(t, "description", path, description, /*required=*/false)) return e;
    if (t.contains("description") && !t["description"].is_null())
      function["description"] = description;
    if (!t.contains("input_schema") || !t["input_schema"].is_object()) {
      return Bad(At(path, "input_schema"), "Field required (a JSON schema, an object)");
    }
    function["parameters"] = t["input_schema"];
    if (t.contains("strict") && !t["strict"].is_null()) function["strict"] = t["strict"];
    tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  Error e = ReadTools(tools, r.chat, r.output);
  if (e) {
    for (std::string* s : {&e->param, &e->message}) {
      for (size_t i = 0; i < tools.size(); ++i) {
        const std::string from = absl::StrCat("tools[", i, "]"), to = At("tools", i);
        *s = absl::StrReplaceAll(*s, {{from + ".function.parameters", to + ".input_schema"},
                                      {from + ".function.", to + "."},
                                      {from, to}});
      }
    }
  }
  return e;
}

Error ToolChoiceField(const Json& j, CompletionRequest& r) {
  if (!j.contains("tool_choice") || j["tool_choice"].is_null()) return std::nullopt;
  const Json& v = j["tool_choice"];
  std::string type;
  if (auto e = TypeOf(v, "tool_choice", type)) return e;
  if (auto e = OnlyKnown(v, "tool_choice", {"type", "name", "disable_parallel_tool_use"})) return e;
  bool one_call = false;
  if (auto e = Flag(v, "disable_parallel_tool_use", "tool_choice", one_call)) return e;
  r.output.parallel_tool_calls = !one_call;
  // As the OpenAI choices render: "required" and "none" a message, auto and a named tool none.
  if (type == "auto") {
    r.output.tool_choice = ToolChoice::kAuto;
    r.chat.tool_choice = "auto";
  } else if (type == "any") {
    if (r.output.tools.empty()) return Bad("tool_choice", "'any' needs tools to be declared");
    r.output.tool_choice = ToolChoice::kRequired;
    r.chat.tool_choice = "required";
  } else if (type == "none") {
    r.output.tool_choice = ToolChoice::kNone;
    r.chat.tool_choice = "none";
  } else if (type == "tool") {
    if (auto e = String(v, "name", "tool_choice", r.output.named_tool)) return e;
    const auto& tools = r.output.tools;
    if (std::none_of(tools.begin(), tools.end(),
                     [&](const ToolSpec& t) { return t.name == r.output.named_tool; })) {
      return Bad("tool_choice.name",
                 absl::StrCat("the tool '", r.output.named_tool, "' is not declared in 'tools'"));
    }
    r.output.tool_choice = ToolChoice::kNamed;
  } else {
    return Bad("tool_choice.type", "Input should be 'auto', 'any', 'tool' or 'none'");
  }
  return std::nullopt;
}

// Off unless enabled, as this API defines it; the budget caps the think channel.
Error Thinking(const Json& j, CompletionRequest& r) {
  r.chat.thinking = false;
  if (j.contains("thinking") && !j["thinking"].is_null()) {
    const Json& v = j["thinking"];
    std::string type;
    if (auto e = TypeOf(v, "thinking", type)) return e;
    if (type == "enabled") {
      if (auto e = OnlyKnown(v, "thinking", {"type", "budget_tokens"})) return e;
      if (!v.contains("budget_tokens")) return Bad("thinking.budget_tokens", "Field required");
      int64_t budget = 0;
      if (auto e = ReadInt(v, "budget_tokens", 1, std::numeric_limits<int32_t>::max(), budget)) {
        e->param = "thinking.budget_tokens";
        return e;
      }
      r.chat.thinking = true;
      r.reasoning_budget = static_cast<int32_t>(budget);
    } else if (type == "disabled") {
      if (auto e = OnlyKnown(v, "thinking", {"type"})) return e;
    } else {
      return Bad("thinking.type", "Input should be 'enabled' or 'disabled'");
    }
  }
  r.output.thinking = r.chat.thinking;
  return std::nullopt;
}

Error Sampling(const Json& j, CompletionRequest& r, bool count_tokens) {
  if (j.contains("max_tokens") && !j["max_tokens"].is_null()) {
    int64_t v = 0;
    if (auto e = ReadInt(j, "max_tokens", 1, std::numeric_limits<int32_t>::max(), v)) return e;
    r.max_tokens = static_cast<int32_t>(v);
  } else if (!count_tokens) {
    return Bad("max_tokens", "Field required");
  }
  return ReadSampling(j, 1, r);  // no seed: the body has none (unknown fields were refused)
}

Error StopSequences(const Json& j, std::vector<std::string>& out) {
  if (!j.contains("stop_sequences") || j["stop_sequences"].is_null()) return std::nullopt;
  const Json& v = j["stop_sequences"];
  if (!v.is_array()) return Bad("stop_sequences", "Input should be a list of strings");
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string() || v[i].get<std::string>().empty()) {
      return Bad(At("stop_sequences", i), "Input should be a non-empty string");
    }
    out.push_back(v[i].get<std::string>());
  }
  return std::nullopt;
}

Error Parse(const Json& j, bool count_tokens, CompletionRequest& r) {
  if (!j.is_object()) return Bad("", "the request body must be a JSON object");
  // return_token_ids: a k3 extension, as on the OpenAI routes.
  if (auto e = OnlyKnown(
          j, "",
          {"model", "system", "messages", "max_tokens", "stop_sequences", "temperature", "top_p",
           "top_k", "metadata", "stream", "thinking", "tools", "tool_choice", "return_token_ids"}))
    return e;
  r.endpoint = Endpoint::kChat;
  if (auto e = String(j, "model", "", r.model, /*required=*/false)) return e;
  if (j.contains("metadata") && !j["metadata"].is_null() && !j["metadata"].is_object()) {
    return Bad("metadata", "Input should be an object");
  }
  if (auto e = Flag(j, "stream", "", r.stream)) return e;
  if (auto e = Flag(j, "return_token_ids", "", r.return_token_ids)) return e;
  if (auto e = Sampling(j, r, count_tokens)) return e;
  if (auto e = StopSequences(j, r.stop)) return e;
  if (auto e = System(j, r.messages)) return e;
  if (auto e = Messages(j, r.messages)) return e;
  if (auto e = Thinking(j, r)) return e;
  if (auto e = Tools(j, r)) return e;
  return ToolChoiceField(j, r);
}

}  // namespace
}  // namespace messages_api

ParseResult ParseMessagesRequest(std::string_view body, bool count_tokens) {
  return ParseBody(body, [count_tokens](const nlohmann::ordered_json& j, CompletionRequest& r) {
    return messages_api::Parse(j, count_tokens, r);
  });
}

nlohmann::json AnthropicErrorJson(const ApiError& error) {
  std::string type = "api_error";
  switch (error.http_status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      if (error.http_status < 500) type = "invalid_request_error";
  }
  const std::string message =
      error.param.empty() ? error.message : absl::StrCat(error.param, ": ", error.message);
  return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace k3::server
