// What the files of the HTTP server share (not for use outside apps/server/).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "apps/server/openai_request.h"
#include "nlohmann/json.hpp"

namespace httplib {
class DataSink;
class Request;
class Response;
}  // namespace httplib

namespace k3::server {

// JSON text for a client: bytes that are not UTF-8 (a reply can end inside a character, and
// a model can sample any bytes) become U+FFFD instead of failing the answer.
std::string Dump(const nlohmann::json& j);

// Answers `req` with server-sent events written by `provide` (httplib's chunked content
// provider; `released(success)` when the stream ends): text/event-stream; charset=utf-8, never
// cached, never compressed.
void SendEventStream(const httplib::Request& req, httplib::Response& res,
                     std::function<bool(size_t, httplib::DataSink&)> provide,
                     std::function<void(bool)> released = nullptr);

// In the OpenAI API's shape; 429 with Retry-After.
void SendError(httplib::Response& res, const ApiError& error);
// In the shape of the API `req` was sent to (Anthropic's under /v1/messages, else OpenAI's).
void SendError(const httplib::Request& req, httplib::Response& res, const ApiError& error);
// 400 for InvalidArgument, 429 ResourceExhausted, 503 Unavailable, else 500.
ApiError ErrorFromStatus(const absl::Status& status);

}  // namespace k3::server
