// The HTTP side of `k3 serve`: the routes of routes.h (OpenAI's, Anthropic's, the page's and
// k3's own) behind the API key, body limits and errors in the API's shape. Requests go to a
// GenerationService; one HTTP thread follows each request to its end.
//
// cpp-httplib (Debian's libcpp-httplib-dev 0.11) rather than Boost.Beast: its thread pool and
// chunked content providers are exactly "one thread follows one request, writing events as
// tokens come", and a failed write is how a gone client shows; Beast would have us write the
// connection handling, the event loop and the per-stream state machines ourselves, for a
// server whose clients number in the tens and whose every token costs far more than a thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/server/generation_service.h"
#include "apps/server/server_context.h"
#include "core/text/tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace k3::server {

// The transport: the listening socket, httplib's threads, the API key, errors in the API's
// shape, the log line and the count of each request; the routes' handlers (routes.h) do the
// rest.
class HttpServer {
 public:
  HttpServer(GenerationService& service, const Tokenizer& tokenizer, std::vector<int32_t> stop_ids,
             int vocab_size, const ServerOptions& options);
  ~HttpServer();

  // Binds the address; the port it listens on. Unavailable naming the address on failure.
  absl::StatusOr<int> Bind();
  void Serve();  // until Stop
  void Stop();   // from any thread

 private:
  void Configure();
  // Whether `req` may go on to its route: the key, when the server has one and the route asks.
  bool Admitted(const httplib::Request& req) const;
  void Refuse(const httplib::Request& req, httplib::Response& res) const;  // 401
  void AnswerError(const httplib::Request& req, httplib::Response& res) const;
  void Log(const httplib::Request& req, const httplib::Response& res);

  std::unique_ptr<ServerContext> server_;
  std::unique_ptr<httplib::Server> http_;
};

}  // namespace k3::server
