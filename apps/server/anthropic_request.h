// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens) read into the
// same CompletionRequest as an OpenAI chat, so that both render, constrain and parse one way:
// system and messages become ChatMessages (tool_use blocks assistant calls, tool_result blocks
// tool messages, thinking blocks the assistant's reasoning), tools and tool_choice the
// OpenAI-shaped declarations, `thinking` the thinking switch (off unless enabled, as that API
// defines it). Like the OpenAI parser it never throws; errors name the field as that API does
// ("messages.1.content.0.tool_use_id").
#pragma once

#include <string_view>

#include "apps/server/openai_request.h"
#include "nlohmann/json.hpp"

namespace k3::server {

// The body of a POST to /v1/messages, or to /v1/messages/count_tokens (`count_tokens`: then
// max_tokens is not required).
ParseResult ParseMessagesRequest(std::string_view body, bool count_tokens);

// {"type": "error", "error": {"type", "message"}}, the type from the HTTP status
// (invalid_request_error, authentication_error, not_found_error, rate_limit_error, api_error,
// overloaded_error, ...); the message begins with the field at fault.
nlohmann::json AnthropicErrorJson(const ApiError& error);

}  // namespace k3::server
