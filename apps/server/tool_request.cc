#include "apps/server/tool_request.h"

#include "absl/strings/str_cat.h"
#include "core/text/grammar/json_schema.h"

namespace k3::server {
namespace {

using Json = nlohmann::ordered_json;

// A tool as the declaration renders it: null-valued keys dropped at the tool and function
// level, nothing inside the parameters touched (TOOLS.md section 0).
nlohmann::json DeclaredTool(const Json& tool) {
  nlohmann::json out = nlohmann::json::object();
  for (auto it = tool.begin(); it != tool.end(); ++it) {
    if (it.value().is_null()) continue;
    if (it.key() == "function" && it.value().is_object()) {
      nlohmann::json function = nlohmann::json::object();
      for (auto f = it.value().begin(); f != it.value().end(); ++f) {
        if (!f.value().is_null()) function[f.key()] = nlohmann::json::parse(f.value().dump());
      }
      out["function"] = std::move(function);
    } else {
      out[it.key()] = nlohmann::json::parse(it.value().dump());
    }
  }
  return out;
}

std::optional<ApiError> ReadTool(const Json& tool, size_t i, ChatOptions& chat,
                                 OutputSpec& output) {
  const std::string where = absl::StrCat("tools[", i, "]");
  if (!tool.is_object())
    return InvalidField(where, absl::StrCat("'", where, "' must be an object"));
  if (!tool.contains("type") || tool["type"] != "function") {
    return InvalidField(where + ".type", absl::StrCat("'", where, ".type' must be \"function\""));
  }
  if (!tool.contains("function") || !tool["function"].is_object()) {
    return InvalidField(where + ".function",
                        absl::StrCat("'", where, ".function' must be an object"));
  }
  const Json& f = tool["function"];
  if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
    return InvalidField(where + ".function.name",
                        absl::StrCat("'", where, ".function.name' must be a non-empty string"));
  }
  ToolSpec spec;
  spec.name = f["name"].get<std::string>();
  for (const ToolSpec& other : output.tools) {
    if (other.name == spec.name) {
      return InvalidField(where + ".function.name",
                          absl::StrCat("the tool '", spec.name, "' is declared twice"));
    }
  }
  if (f.contains("parameters") && !f["parameters"].is_null()) {
    const std::string param = where + ".function.parameters";
    if (!f["parameters"].is_object()) {
      return InvalidField(param, absl::StrCat("'", param, "' must be a JSON schema (an object)"));
    }
    spec.parameters = f["parameters"];
  }
  if (f.contains("strict") && f["strict"].is_boolean()) spec.strict = f["strict"].get<bool>();
  if (spec.strict) {
    const std::string param = where + ".function.parameters";
    if (absl::Status s = grammar::CheckToolParameters(spec.parameters, param); !s.ok()) {
      return InvalidField(param, std::string(s.message()));
    }
  }
  output.tools.push_back(std::move(spec));
  chat.tools.push_back(DeclaredTool(tool));
  return std::nullopt;
}

std::optional<ApiError> ReadToolChoice(const Json& j, CompletionRequest& r) {
  if (!j.contains("tool_choice") || j["tool_choice"].is_null()) return std::nullopt;
  const Json& v = j["tool_choice"];
  if (v.is_string()) {
    const std::string choice = v.get<std::string>();
    if (choice == "none") {
      r.output.tool_choice = ToolChoice::kNone;
    } else if (choice == "auto") {
      r.output.tool_choice = ToolChoice::kAuto;
    } else if (choice == "required") {
      r.output.tool_choice = ToolChoice::kRequired;
    } else {
      return InvalidField("tool_choice", absl::StrCat("'tool_choice' must be \"none\", \"auto\", "
                                                      "\"required\" or a named function, not '",
                                                      choice, "'"));
    }
    r.chat.tool_choice = choice;
  } else if (v.is_object() && v.contains("function") && v["function"].is_object() &&
             v["function"].contains("name") && v["function"]["name"].is_string()) {
    r.output.tool_choice = ToolChoice::kNamed;
    r.output.named_tool = v["function"]["name"].get<std::string>();
    bool declared = false;
    for (const ToolSpec& t : r.output.tools) declared = declared || t.name == r.output.named_tool;
    if (!declared) {
      return InvalidField("tool_choice",
                          absl::StrCat("'tool_choice' names the function '", r.output.named_tool,
                                       "', which 'tools' does not declare"));
    }
  } else {
    return InvalidField("tool_choice",
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (r.output.tools.empty() && r.output.tool_choice == ToolChoice::kRequired) {
    return InvalidField("tool_choice", "'tool_choice' is \"required\" but no tools are declared");
  }
  return std::nullopt;
}

std::optional<ApiError> ReadResponseFormat(const Json& j, CompletionRequest& r) {
  if (!j.contains("response_format") || j["response_format"].is_null()) return std::nullopt;
  const Json& v = j["response_format"];
  if (!v.is_object() || !v.contains("type") || !v["type"].is_string()) {
    return InvalidField("response_format", "'response_format' must be an object with a 'type'");
  }
  const std::string type = v["type"].get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    r.output.response_format = ResponseFormat::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema") {
    return InvalidField("response_format.type",
                        absl::StrCat("'response_format.type' must be \"text\", \"json_object\" or "
                                     "\"json_schema\", not '",
                                     type, "'"));
  }
  if (!v.contains("json_schema") || !v["json_schema"].is_object() ||
      !v["json_schema"].contains("schema") || !v["json_schema"]["schema"].is_object()) {
    return InvalidField("response_format.json_schema.schema",
                        "'response_format.json_schema.schema' must be a JSON schema (an object)");
  }
  r.output.response_format = ResponseFormat::kJsonSchema;
  r.output.response_schema = v["json_schema"]["schema"];
  const std::string param = "response_format.json_schema.schema";
  if (absl::Status s = grammar::CheckResponseSchema(r.output.response_schema, param); !s.ok()) {
    return InvalidField(param, std::string(s.message()));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadEffort(const Json& v, const std::string& param, CompletionRequest& r) {
  if (!v.is_string() || (v != "low" && v != "high" && v != "max")) {
    return InvalidField(param, absl::StrCat("'", param,
                                            "' must be \"low\", \"high\" or \"max\" (Kimi K3's "
                                            "thinking efforts)"));
  }
  r.chat.thinking_effort = v.get<std::string>();
  return std::nullopt;
}

// chat_template_kwargs as vLLM and sglang take it ({"thinking": false}), and reasoning_effort.
std::optional<ApiError> ReadThinking(const Json& j, CompletionRequest& r) {
  if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
    const Json& kw = j["chat_template_kwargs"];
    if (!kw.is_object()) {
      return InvalidField("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    for (auto it = kw.begin(); it != kw.end(); ++it) {
      const std::string param = "chat_template_kwargs." + it.key();
      if (it.key() == "thinking") {
        if (!it.value().is_boolean()) {
          return InvalidField(param, absl::StrCat("'", param, "' must be true or false"));
        }
        r.chat.thinking = it.value().get<bool>();
      } else if (it.key() == "thinking_effort") {
        if (auto e = ReadEffort(it.value(), param, r)) return e;
      } else {
        return InvalidField(param, absl::StrCat("unknown field '", it.key(),
                                                "' in chat_template_kwargs (thinking, "
                                                "thinking_effort)"));
      }
    }
  }
  if (j.contains("reasoning_effort") && !j["reasoning_effort"].is_null()) {
    if (auto e = ReadEffort(j["reasoning_effort"], "reasoning_effort", r)) return e;
  }
  r.output.thinking = r.chat.thinking;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadToolFields(const Json& j, CompletionRequest& r) {
  if (auto e = ReadThinking(j, r)) return e;
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (auto e = ReadTools(j["tools"], r.chat, r.output)) return e;
  }
  // Tools a system message declares in the conversation may be called as well.
  for (const ChatMessage& m : r.messages) {
    if (!m.tools.is_array()) continue;
    for (const auto& tool : m.tools) {
      const Json t = Json::parse(tool.dump());
      if (t.contains("function") && t["function"].contains("name")) {
        ToolSpec spec;
        spec.name = t["function"]["name"].get<std::string>();
        if (t["function"].contains("parameters")) spec.parameters = t["function"]["parameters"];
        r.output.tools.push_back(std::move(spec));
      }
    }
  }
  if (auto e = ReadToolChoice(j, r)) return e;
  if (j.contains("parallel_tool_calls") && !j["parallel_tool_calls"].is_null()) {
    if (!j["parallel_tool_calls"].is_boolean()) {
      return InvalidField("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    }
    r.output.parallel_tool_calls = j["parallel_tool_calls"].get<bool>();
  }
  return ReadResponseFormat(j, r);
}

std::optional<ApiError> ReadTools(const Json& tools, ChatOptions& chat, OutputSpec& output) {
  if (!tools.is_array()) return InvalidField("tools", "'tools' must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    if (auto e = ReadTool(tools[i], i, chat, output)) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> ReadToolCalls(const Json& list, const std::string& where,
                                      std::vector<ChatToolCall>& out) {
  const std::string param = where + ".tool_calls";
  if (list.is_null()) return std::nullopt;
  if (!list.is_array()) return InvalidField(param, absl::StrCat("'", param, "' must be a list"));
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& call = list[i];
    const std::string at = absl::StrCat(param, "[", i, "]");
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
      return InvalidField(at, absl::StrCat("'", at, "' must be an object with a 'function'"));
    }
    const Json& f = call["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty()) {
      return InvalidField(at + ".function.name",
                          absl::StrCat("'", at, ".function.name' must be a non-empty string"));
    }
    ChatToolCall c;
    c.name = f["name"].get<std::string>();
    if (call.contains("id") && call["id"].is_string()) c.id = call["id"].get<std::string>();
    if (f.contains("arguments")) {
      c.arguments = f["arguments"];
      if (!c.arguments.is_null() && !c.arguments.is_string() && !c.arguments.is_object()) {
        return InvalidField(at + ".function.arguments",
                            absl::StrCat("'", at, ".function.arguments' must be a string"));
      }
    }
    out.push_back(std::move(c));
  }
  return std::nullopt;
}

}  // namespace k3::server
