// What every route of `k3 serve` reaches (routes.h): the GenerationService, the tokenizer, the
// server's options, the requests answered (for /metrics), and the one way from a parsed request
// of either API to a job (Submit).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/server/follower.h"
#include "apps/server/generation_service.h"
#include "apps/server/openai_request.h"
#include "core/text/tokenizer/tokenizer.h"

namespace k3::grammar {
class TokenTrie;
}  // namespace k3::grammar

namespace k3::server {

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

class ServerContext {
 public:
  ServerContext(GenerationService& service, const Tokenizer& tokenizer,
                std::vector<int32_t> stop_ids, int vocab_size, const ServerOptions& options);

  GenerationService& service() const { return service_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const ServerOptions& options() const { return options_; }

  // Renders, constrains and submits a parsed request of either API.
  std::optional<ApiError> Submit(const CompletionRequest& r, Submission& out);
  // The request's prompt as token ids: a chat rendered, a completion's text encoded.
  std::optional<ApiError> Prompt(const CompletionRequest& r, std::vector<int32_t>& ids) const;

  // Requests answered, by route label (routes.h) and status.
  using Answered = std::map<std::pair<std::string, int>, int64_t>;
  void Count(std::string_view label, int status);
  Answered answered() const;

 private:
  // The reply's constraints (core/text/tools/reply_constraint.h).
  std::optional<ApiError> Constrain(const CompletionRequest& r, BatchRequest& batch) const;
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> Trie() const;

  GenerationService& service_;
  const Tokenizer& tok_;
  std::vector<int32_t> stop_ids_;
  int vocab_size_;
  ServerOptions options_;
  // The vocabulary as a byte trie, for constrained decoding (Trie(): built once, when first
  // needed).
  mutable std::once_flag trie_once_;
  mutable absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> trie_;
  mutable std::mutex answered_mu_;
  Answered answered_;
};

}  // namespace k3::server
