// The grammar of one assistant turn's output (TOOLS.md section 9), from its OutputSpec. Output
// starts inside the channel the generation prompt opened (think, or response with thinking
// off) and ends with `<|close|>message<|sep|><|end_of_msg|>`.
//
// Decisions beyond TOOLS.md:
//  * JSON responses (json_object, json_schema): the response body is one JSON value (an optional
//    space on either side). If the tool choice allows calls, the body may instead be empty when a
//    tools block follows: a turn that calls a tool says nothing. Tools are governed by the tool
//    choice exactly as in text mode.
//  * A tool's parameters without `properties` (e.g. `{}`, `{"type":"object"}`) allow any
//    arguments, as a JSON object without declared properties does (json_schema.h).
//  * `additionalProperties` true or a schema allows further arguments after the declared ones,
//    their key any attribute text.
//  * The call `index` is any decimal number; the turn's calls are not numbered for the model.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/text/grammar/grammar.h"
#include "core/text/tools/output_spec.h"

namespace k3::grammar {

// Refuses (InvalidArgument) a spec whose grammar cannot be built: an unsupported schema
// (naming the keyword and `tools[i].function.parameters...` or `response_format...`), a named
// choice of an undeclared tool, or a required/named choice without tools.
absl::Status CheckOutputSpec(const OutputSpec& spec);

// The turn's grammar (after CheckOutputSpec).
absl::StatusOr<Grammar> BuildOutputGrammar(const OutputSpec& spec);

// An XTML attribute value: `&` as `&amp;`, then `"` as `&quot;` (TOOLS.md section 2).
std::string EscapeAttribute(std::string_view value);

}  // namespace k3::grammar
