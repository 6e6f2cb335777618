// The parts of an OpenAI chat request that make Kimi K3 an agent (../shared/spec/TOOLS.md):
// `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, the thinking switch
// (`chat_template_kwargs`, `reasoning_effort`), assistant `tool_calls` and `tool` messages.
// Read into the renderer's options and the turn's OutputSpec; errors name the field.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apps/server/openai_request.h"
#include "nlohmann/json.hpp"

namespace k3::server {

// A 400 naming `param` (the reader of the rest of the request makes the same).
ApiError InvalidField(std::string param, std::string message);

// Top-level fields of a chat request: fills r.chat (rendering) and r.output (what the turn may
// be). The messages must have been read (dynamic declarations count as declared tools).
std::optional<ApiError> ReadToolFields(const nlohmann::ordered_json& j, CompletionRequest& r);

// A list of OpenAI tool definitions ({"type": "function", "function": {name, description,
// parameters, strict}}): declared for rendering (chat.tools) and callable (output.tools).
std::optional<ApiError> ReadTools(const nlohmann::ordered_json& tools, ChatOptions& chat,
                                  OutputSpec& output);

// An assistant message's `tool_calls`, at `where` (e.g. "messages[2]").
std::optional<ApiError> ReadToolCalls(const nlohmann::ordered_json& list, const std::string& where,
                                      std::vector<ChatToolCall>& out);

}  // namespace k3::server
