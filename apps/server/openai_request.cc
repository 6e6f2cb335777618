#include "apps/server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "apps/server/tool_request.h"

namespace k3::server {
namespace {

// Ordered: a tool call's object arguments render in the client's key order, and a schema's
// properties are generated in it.
using Json = nlohmann::ordered_json;

ApiError Invalid(std::string param, std::string message) {
  return InvalidField(std::move(param), std::move(message));
}

ApiError Unsupported(const std::string& param, std::string_view what) {
  return {400, absl::StrCat("'", param, "' is not supported by this server", std::string(what)),
          "invalid_request_error", param, "unsupported_parameter"};
}

// What the fields of each endpoint may be. Fields of the OpenAI API that this server does not
// implement are accepted only at their neutral value, and named when they are not.
constexpr std::string_view kCommon[] = {"model",
                                        "max_tokens",
                                        "temperature",
                                        "top_p",
                                        "seed",
                                        "stop",
                                        "n",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "top_k",
                                        "return_token_ids",
                                        "return_progress",
                                        "ignore_eos",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "logit_bias",
                                        "logprobs"};
constexpr std::string_view kChatOnly[] = {"messages",
                                          "max_completion_tokens",
                                          "top_logprobs",
                                          "tools",
                                          "tool_choice",
                                          "response_format",
                                          "parallel_tool_calls",
                                          "functions",
                                          "function_call",
                                          "metadata",
                                          "store",
                                          "chat_template_kwargs",
                                          "reasoning_effort",
                                          "reasoning_budget"};
constexpr std::string_view kCompletionOnly[] = {"prompt", "echo", "best_of", "suffix"};

bool Known(std::string_view key, Endpoint endpoint) {
  auto in = [&](const auto& list) {
    return std::find(std::begin(list), std::end(list), key) != std::end(list);
  };
  return in(kCommon) || (endpoint == Endpoint::kChat ? in(kChatOnly) : in(kCompletionOnly));
}

}  // namespace

std::optional<ApiError> ReadInt(const Json& j, const std::string& key, int64_t lo, int64_t hi,
                                int64_t& out) {
  const Json& v = j[key];
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Invalid(key, absl::StrCat("'", key, "' must be at most ", hi));
    }
    out = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             v.get<double>() == std::floor(v.get<double>()) && std::abs(v.get<double>()) < 1e18) {
    out = static_cast<int64_t>(v.get<double>());
  } else {
    return Invalid(key, absl::StrCat("'", key, "' must be an integer"));
  }
  if (out < lo || out > hi) {
    return Invalid(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", out));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadNumber(const Json& j, const std::string& key, double lo, double hi,
                                   double& out) {
  const Json& v = j[key];
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    return Invalid(key, absl::StrCat("'", key, "' must be a number"));
  }
  out = v.get<double>();
  if (out < lo || out > hi) {
    return Invalid(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "]"));
  }
  return std::nullopt;
}

namespace {

bool Neutral(const Json& v) {
  return v.is_null() || v == false || (v.is_number() && v.get<double>() == 0) ||
         (v.is_object() && v.empty()) || (v.is_array() && v.empty());
}

// Message content: a string, or a list of text parts (as the API allows for every role).
std::optional<ApiError> ReadContent(const Json& v, const std::string& param, std::string& out,
                                    std::vector<std::string>* parts = nullptr) {
  if (v.is_string()) {
    out = v.get<std::string>();
    return std::nullopt;
  }
  if (v.is_null()) return std::nullopt;
  if (!v.is_array())
    return Invalid(param, absl::StrCat("'", param, "' must be a string or a list of parts"));
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& part = v[i];
    const std::string where = absl::StrCat(param, "[", i, "]");
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return Invalid(where, absl::StrCat("'", where, "' must be an object with a 'type'"));
    }
    if (part["type"] != "text") {
      return Unsupported(where, absl::StrCat(" (content parts of type '",
                                             part["type"].get<std::string>(), "'; text only)"));
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return Invalid(where, absl::StrCat("'", where, ".text' must be a string"));
    }
    out += part["text"].get<std::string>();
    if (parts != nullptr) parts->push_back(part["text"].get<std::string>());
  }
  return std::nullopt;
}

// The fields a message of each role may have besides role and content.
bool KnownMessageField(const std::string& role, const std::string& key) {
  if (key == "name") return true;
  if (role == "assistant") return key == "reasoning_content" || key == "tool_calls";
  if (role == "tool") return key == "tool_call_id";
  if (role == "system") return key == "tools";
  return false;
}

std::optional<ApiError> ReadString(const Json& m, const std::string& key, const std::string& where,
                                   std::string& out) {
  if (!m.contains(key) || m[key].is_null()) return std::nullopt;
  if (!m[key].is_string()) {
    return Invalid(absl::StrCat(where, ".", key),
                   absl::StrCat("'", where, ".", key, "' must be a string"));
  }
  out = m[key].get<std::string>();
  return std::nullopt;
}

// Content, name, reasoning, tool calls, the tool_call_id of a result, dynamic tools.
std::optional<ApiError> ReadMessageFields(const Json& m, const std::string& where,
                                          ChatMessage& message) {
  if (message.role == "assistant" && m.contains("tool_calls")) {
    if (auto e = ReadToolCalls(m["tool_calls"], where, message.tool_calls)) return e;
  }
  // An assistant's calls may stand without content.
  if (!m.contains("content") && message.tool_calls.empty()) {
    return Invalid(where + ".content", absl::StrCat("'", where, ".content' is required"));
  }
  if (m.contains("content")) {
    if (auto e = ReadContent(m["content"], where + ".content", message.content, &message.parts)) {
      return e;
    }
  }
  if (auto e = ReadString(m, "name", where, message.name)) return e;
  if (m.contains("reasoning_content")) {
    if (auto e =
            ReadContent(m["reasoning_content"], where + ".reasoning_content", message.thinking)) {
      return e;
    }
  }
  if (message.role == "tool") {
    if (auto e = ReadString(m, "tool_call_id", where, message.tool_call_id)) return e;
    if (message.tool_call_id.empty()) {
      return Invalid(where + ".tool_call_id",
                     absl::StrCat("'", where, ".tool_call_id' is required in a tool message"));
    }
  }
  if (m.contains("tools") && !m["tools"].is_null()) {
    if (!m["tools"].is_array()) {
      return Invalid(where + ".tools", absl::StrCat("'", where, ".tools' must be a list"));
    }
    message.tools = nlohmann::json::parse(m["tools"].dump());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadMessages(const Json& j, std::vector<ChatMessage>& out) {
  if (!j.contains("messages")) return Invalid("messages", "'messages' is required");
  const Json& list = j["messages"];
  if (!list.is_array() || list.empty()) {
    return Invalid("messages", "'messages' must be a non-empty list");
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(where, absl::StrCat("'", where, "' must be an object"));
    if (!m.contains("role") || !m["role"].is_string()) {
      return Invalid(where + ".role", absl::StrCat("'", where, ".role' must be a string"));
    }
    ChatMessage message;
    message.role = m["role"].get<std::string>();
    if (message.role == "developer") message.role = "system";
    if (message.role == "function") {
      return Unsupported(where + ".role", " (function messages; use tool messages)");
    }
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "tool") {
      return Invalid(where + ".role", absl::StrCat("unknown role '", message.role, "'"));
    }
    for (const auto& field : m.items()) {
      const std::string& key = field.key();
      if (key == "role" || key == "content" || KnownMessageField(message.role, key)) continue;
      return Invalid(absl::StrCat(where, ".", key),
                     absl::StrCat("unknown field '", key, "' in ", where));
    }
    if (auto e = ReadMessageFields(m, where, message)) return e;
    out.push_back(std::move(message));
  }
  return std::nullopt;
}

std::optional<ApiError> ReadIds(const Json& list, const std::string& param,
                                std::vector<int32_t>& out) {
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& v = list[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid(param,
                     absl::StrCat("'", param, "[", i, "]' must be a token id (an integer >= 0)"));
    }
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return std::nullopt;
}

// A string, a list of token ids, or a list holding one of those (several prompts need n > 1).
std::optional<ApiError> ReadPrompt(const Json& j, CompletionRequest& r) {
  if (!j.contains("prompt")) return Invalid("prompt", "'prompt' is required");
  const Json* p = &j["prompt"];
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    if (r.prompt_text->empty()) return Invalid("prompt", "'prompt' is empty");
    return std::nullopt;
  }
  if (!p->is_array()) return Invalid("prompt", "'prompt' must be a string or a list of token ids");
  if (p->empty()) return Invalid("prompt", "'prompt' is empty");
  if (!(*p)[0].is_number()) return Unsupported("prompt", " (several prompts in one request)");
  return ReadIds(*p, "prompt", r.prompt_ids);
}

std::optional<ApiError> ReadStop(const Json& v, std::vector<std::string>& out) {
  if (v.is_null()) return std::nullopt;
  if (v.is_string()) {
    if (v.get<std::string>().empty()) return Invalid("stop", "'stop' must not be empty");
    out.push_back(v.get<std::string>());
    return std::nullopt;
  }
  if (!v.is_array() || v.size() > 4) {
    return Invalid("stop", "'stop' must be a string or a list of up to 4 strings");
  }
  for (const Json& s : v) {
    if (!s.is_string() || s.get<std::string>().empty()) {
      return Invalid("stop", "'stop' must hold non-empty strings");
    }
    out.push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadFlag(const Json& j, const std::string& key, bool& out) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_boolean()) return Invalid(key, absl::StrCat("'", key, "' must be true or false"));
  out = j[key].get<bool>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadSampling(const Json& j, double max_temperature, CompletionRequest& r) {
  // The API's defaults: temperature 1, top_p 1, no top-k.
  SamplerOptions& s = r.sampler;
  s.greedy = false;
  s.temperature = 1.0;
  s.top_p = 1.0;
  s.top_k = 0;
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    if (auto e = ReadNumber(j, "temperature", 0, max_temperature, s.temperature)) return e;
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) {
    if (auto e = ReadNumber(j, "top_p", 0, 1, s.top_p)) return e;
    if (s.top_p == 0) return Invalid("top_p", "'top_p' must be greater than 0");
  }
  int64_t v = 0;
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (auto e = ReadInt(j, "top_k", 0, 1 << 20, v)) return e;
    s.top_k = static_cast<int>(v);
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (auto e = ReadInt(j, "seed", std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max(), v)) {
      return e;
    }
    s.seed = static_cast<uint64_t>(v);
    r.seeded = true;
  }
  s.greedy = s.temperature == 0;
  if (s.greedy) s.temperature = 1.0;  // unused, but kept valid
  return std::nullopt;
}

namespace {

// Chat: logprobs true (top_logprobs 0..20 alternatives); completions: logprobs N (0..5).
std::optional<ApiError> ReadLogprobs(const Json& j, Endpoint endpoint, CompletionRequest& r) {
  int64_t v = 0;
  const bool given = j.contains("logprobs") && !j["logprobs"].is_null();
  if (endpoint == Endpoint::kCompletion) {
    if (!given || j["logprobs"] == false) return std::nullopt;
    if (auto e = ReadInt(j, "logprobs", 0, 5, v)) return e;
    r.top_logprobs = static_cast<int>(v);
    return std::nullopt;
  }
  bool on = false;
  if (auto e = ReadFlag(j, "logprobs", on)) return e;
  if (j.contains("top_logprobs") && !j["top_logprobs"].is_null()) {
    if (auto e = ReadInt(j, "top_logprobs", 0, 20, v)) return e;
    if (!on) return Invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  if (on) r.top_logprobs = static_cast<int>(v);
  return std::nullopt;
}

std::optional<ApiError> Parse(const Json& j, Endpoint endpoint, CompletionRequest& r) {
  if (!j.is_object()) return Invalid("", "the request body must be a JSON object");
  for (const auto& field : j.items()) {
    if (!Known(field.key(), endpoint)) {
      return Invalid(field.key(),
                     absl::StrCat("Unrecognized request argument supplied: ", field.key()));
    }
  }
  r.endpoint = endpoint;
  if (j.contains("model")) {
    if (!j["model"].is_string()) return Invalid("model", "'model' must be a string");
    r.model = j["model"].get<std::string>();
  }
  // Options this server leaves out, accepted at the value that means "off".
  for (const char* key : {"presence_penalty", "frequency_penalty", "logit_bias", "functions",
                          "function_call", "suffix"}) {
    if (j.contains(key) && !Neutral(j[key])) return Unsupported(key, "");
  }
  int64_t v = 0;
  for (const char* key : {"n", "best_of"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (auto e = ReadInt(j, key, 1, 1 << 20, v)) return e;
    if (v != 1) return Unsupported(key, " (only 1)");
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (auto e = ReadInt(j, key, 0, std::numeric_limits<int32_t>::max(), v)) return e;
    r.max_tokens = static_cast<int32_t>(v);
  }
  if (auto e = ReadSampling(j, 2, r)) return e;
  if (j.contains("stop")) {
    if (auto e = ReadStop(j["stop"], r.stop)) return e;
  }
  if (auto e = ReadFlag(j, "stream", r.stream)) return e;
  if (auto e = ReadFlag(j, "return_token_ids", r.return_token_ids)) return e;
  if (auto e = ReadFlag(j, "return_progress", r.return_progress)) return e;
  if (auto e = ReadFlag(j, "ignore_eos", r.ignore_eos)) return e;
  if (auto e = ReadFlag(j, "echo", r.echo)) return e;
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const Json& o = j["stream_options"];
    if (!o.is_object()) return Invalid("stream_options", "'stream_options' must be an object");
    for (const auto& field : o.items()) {
      if (field.key() != "include_usage") {
        return Invalid("stream_options." + field.key(),
                       absl::StrCat("unknown field '", field.key(), "' in stream_options"));
      }
    }
    if (auto e = ReadFlag(o, "include_usage", r.include_usage)) return e;
  }
  if (j.contains("user") && !j["user"].is_string() && !j["user"].is_null()) {
    return Invalid("user", "'user' must be a string");
  }
  if (auto e = ReadLogprobs(j, endpoint, r)) return e;
  if (endpoint == Endpoint::kCompletion) return ReadPrompt(j, r);
  if (j.contains("reasoning_budget") && !j["reasoning_budget"].is_null()) {
    if (auto e = ReadInt(j, "reasoning_budget", -1, std::numeric_limits<int32_t>::max(), v)) {
      return e;
    }
    r.reasoning_budget = static_cast<int32_t>(v);
  }
  if (auto e = ReadMessages(j, r.messages)) return e;
  return ReadToolFields(j, r);
}

}  // namespace

ApiError InvalidField(std::string param, std::string message) {
  return {400, std::move(message), "invalid_request_error", std::move(param), ""};
}

nlohmann::json ApiError::ToJson() const {
  nlohmann::json error = {
      {"message", message},
      {"type", type},
      {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
      {"code", code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code)}};
  return {{"error", std::move(error)}};
}

ParseResult ParseBody(std::string_view body, const BodyReader& read) {
  ParseResult result;
  const Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    result.error = Invalid("", "the request body is not valid JSON");
    return result;
  }
  CompletionRequest request;
  if (auto e = read(j, request)) {
    result.error = std::move(e);
  } else {
    result.request = std::move(request);
  }
  return result;
}

ParseResult ParseCompletionRequest(std::string_view body, Endpoint endpoint) {
  return ParseBody(
      body, [endpoint](const Json& j, CompletionRequest& r) { return Parse(j, endpoint, r); });
}

}  // namespace k3::server
