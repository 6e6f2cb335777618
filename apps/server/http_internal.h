// What the files of the HTTP server share (not for use outside apps/server/).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "apps/server/openai_request.h"
#include "nlohmann/json.hpp"

namespace httplib {
class Request;
class Response;
}  // namespace httplib

namespace k3::server {

// JSON text for a client: bytes that are not UTF-8 (a reply can end inside a character, and
// a model can sample any bytes) become U+FFFD instead of failing the answer.
std::string Dump(const nlohmann::json& j);
// The same for ordered JSON (Anthropic's answers keep their keys in the API's order).
std::string DumpOrdered(const nlohmann::ordered_json& j);

// In the OpenAI API's shape; 429 with Retry-After.
void SendError(httplib::Response& res, const ApiError& error);
// In the shape of the API `req` was sent to (Anthropic's under /v1/messages, else OpenAI's).
void SendError(const httplib::Request& req, httplib::Response& res, const ApiError& error);
// 400 for InvalidArgument, 429 ResourceExhausted, 503 Unavailable, else 500.
ApiError ErrorFromStatus(const absl::Status& status);

}  // namespace k3::server
