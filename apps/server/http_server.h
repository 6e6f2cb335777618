// The HTTP side of `k3 serve`: the OpenAI routes, Anthropic's Messages, the API key, body limits
// and errors in the API's shape, server-sent events, and /metrics. Requests go to a
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
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/server/generation_service.h"
#include "apps/server/openai_request.h"
#include "core/text/tokenizer/tokenizer.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace k3::grammar {
class TokenTrie;
}  // namespace k3::grammar

namespace k3::server {

struct Submission;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                   // 0: any free port
  std::string api_key;               // empty: no key asked for
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  int32_t default_max_tokens = 256;  // when a request gives none
  int32_t reasoning_budget = -1;     // think tokens at most when a request gives none (-1: any)
  std::string model_id = "kimi-k3";  // what /v1/models lists and answers carry
  int threads = 16;                  // HTTP threads: requests followed at once
  bool log_requests = true;          // one line per request on stderr
};

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
  struct Counters;
  void Routes();
  void Complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint);
  // Anthropic's POST /v1/messages and /v1/messages/count_tokens (anthropic_reply.cc).
  void Messages(const httplib::Request& req, httplib::Response& res);
  void CountTokens(const httplib::Request& req, httplib::Response& res);
  // Renders, constrains and submits a parsed request of either API.
  std::optional<ApiError> Submit(const CompletionRequest& r, Submission& out);
  std::optional<ApiError> Prompt(const CompletionRequest& r, std::vector<int32_t>& ids) const;
  // The reply's constraints (core/text/tools/reply_constraint.h).
  std::optional<ApiError> Constrain(const CompletionRequest& r, BatchRequest& batch) const;
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> Trie() const;
  std::string Metrics() const;

  GenerationService& service_;
  const Tokenizer& tok_;
  std::vector<int32_t> stop_ids_;
  int vocab_size_;
  // The vocabulary as a byte trie, for constrained decoding (Trie(): built once, when first
  // needed).
  mutable std::once_flag trie_once_;
  mutable absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> trie_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<Counters> counters_;
};

}  // namespace k3::server
