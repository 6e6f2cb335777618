// What a chat turn's output may be (../shared/spec/TOOLS.md sections 9 and 10): the tools the
// request declares, the tool choice, the response format and whether the generation prompt
// opened the think channel. The renderer, the output parser and the constrained decoder all
// read it, so that the three agree on one turn.
#pragma once

#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace k3 {

// A function the model may call (an OpenAI `tools[i].function`).
struct ToolSpec {
  std::string name;
  // Its JSON schema, keys in the client's order (required keys are generated in that order).
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();
  bool strict = true;  // false: constrain the call's structure and name only, not its schema
};

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };
enum class ResponseFormat { kText, kJsonObject, kJsonSchema };

struct OutputSpec {
  bool thinking = true;         // the generation prompt opened `think` (else `response`)
  std::vector<ToolSpec> tools;  // declared tools: the request's and the dynamic ones
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string named_tool;           // with kNamed
  bool parallel_tool_calls = true;  // false: at most one call
  ResponseFormat response_format = ResponseFormat::kText;
  nlohmann::ordered_json response_schema;  // with kJsonSchema

  // True when the client asked for structure that must come whole: a call (required or named)
  // or a JSON response. The grammar then ends the turn within its max_tokens.
  bool forced() const {
    return tool_choice == ToolChoice::kRequired || tool_choice == ToolChoice::kNamed ||
           response_format != ResponseFormat::kText;
  }

  // True when the turn's tokens must be constrained at all (tools are declared, or a JSON
  // response is asked for); a plain chat samples freely.
  bool constrained() const { return !tools.empty() || response_format != ResponseFormat::kText; }
};

}  // namespace k3
