// The requests of the OpenAI API that `k3 serve` answers (POST /v1/chat/completions and
// /v1/completions), parsed and checked in full before anything runs, and the error shape of
// that API. The parser never throws: whatever a client sends ends as a request or an ApiError
// naming the field (fuzz/openai_request_fuzz.cc holds it to that).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/sampler.h"
#include "core/text/chat_template.h"
#include "core/text/tools/output_spec.h"
#include "nlohmann/json.hpp"

namespace k3::server {

// {"error": {"message", "type", "param", "code"}}, sent with `http_status`.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the field at fault; empty for none (null)
  std::string code;   // empty for none (null)

  nlohmann::json ToJson() const;
};

enum class Endpoint { kChat, kCompletion };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<ChatMessage> messages;  // chat
  ChatOptions chat;                   // chat: thinking, effort, declared tools, tool choice
  OutputSpec output;                  // chat: what the reply may be (tools, JSON)
  // chat: the most tokens the think channel may take before the server closes it and opens
  // the response (unset: the server's --reasoning-budget).
  std::optional<int32_t> reasoning_budget;
  std::optional<std::string> prompt_text;  // completions: text ...
  std::vector<int32_t> prompt_ids;         // ... or token ids
  std::optional<int32_t> max_tokens;       // absent: the server's default
  SamplerOptions sampler;                  // temperature 0 means greedy
  bool seeded = false;                     // the request gave a seed
  std::vector<std::string> stop;           // up to 4 strings
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // as vLLM: prompt_token_ids and token_ids in the answer
  // As llama.cpp's server: a stream carries the prompt's progress while it runs (chunks with
  // prompt_progress {total, cache, processed, time_ms} and no choices).
  bool return_progress = false;
  bool ignore_eos = false;  // as vLLM: no stop ids, max_tokens tokens (stop strings apply)
  // Log probabilities of each sampled token and of its top_logprobs alternatives (chat:
  // logprobs true and top_logprobs 0..20; completions: logprobs N, 0..5); -1: none.
  int top_logprobs = -1;
  // Completions: the prompt's text comes before the completion's, and with logprobs the
  // prompt's tokens come first in them, each token's log probability given the ones before it
  // (null for the first), as evaluation harnesses score a continuation.
  bool echo = false;
};

struct ParseResult {
  std::optional<CompletionRequest> request;
  std::optional<ApiError> error;
};

// The number `j[key]` within [lo, hi], else a 400 naming `key`: integers are JSON integers or
// floats with an integral value. Shared by the parser of Anthropic's requests.
std::optional<ApiError> ReadInt(const nlohmann::ordered_json& j, const std::string& key, int64_t lo,
                                int64_t hi, int64_t& out);
std::optional<ApiError> ReadNumber(const nlohmann::ordered_json& j, const std::string& key,
                                   double lo, double hi, double& out);

// temperature (in [0, max_temperature], 0 greedy), top_p, top_k and seed, at the defaults of
// both APIs when absent: temperature 1, no nucleus or top-k cut.
std::optional<ApiError> ReadSampling(const nlohmann::ordered_json& j, double max_temperature,
                                     CompletionRequest& r);

// Parses `body` as JSON, never throwing, and reads it with `read`: the request, or its error.
using BodyReader =
    std::function<std::optional<ApiError>(const nlohmann::ordered_json&, CompletionRequest&)>;
ParseResult ParseBody(std::string_view body, const BodyReader& read);

// The body of a POST to `endpoint`. Errors are 400 with `param` set, except what only the
// server can judge (the model name, the context, the vocabulary).
ParseResult ParseCompletionRequest(std::string_view body, Endpoint endpoint);

}  // namespace k3::server
