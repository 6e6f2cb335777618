#include "apps/server/server_context.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "apps/server/http_internal.h"
#include "core/text/chat_template.h"
#include "core/text/grammar/token_mask.h"
#include "core/text/tools/reply_constraint.h"

namespace k3::server {

ServerContext::ServerContext(GenerationService& service, const Tokenizer& tokenizer,
                             std::vector<int32_t> stop_ids, int vocab_size,
                             const ServerOptions& options)
    : service_(service),
      tok_(tokenizer),
      stop_ids_(std::move(stop_ids)),
      vocab_size_(vocab_size),
      options_(options) {}

void ServerContext::Count(std::string_view label, int status) {
  std::lock_guard lock(answered_mu_);
  ++answered_[{std::string(label), status}];
}

ServerContext::Answered ServerContext::answered() const {
  std::lock_guard lock(answered_mu_);
  return answered_;
}

// With tools or a JSON response format, every token of the reply is sampled under the turn's
// grammar (core/text/grammar), so that what comes back parses and validates; a thinking budget
// closes the think channel after its tokens.
std::optional<ApiError> ServerContext::Constrain(const CompletionRequest& r,
                                                 BatchRequest& batch) const {
  if (r.endpoint != Endpoint::kChat) return std::nullopt;
  const std::string param = !r.output.constrained()  ? "reasoning_budget"
                            : r.output.tools.empty() ? "response_format"
                                                     : "tools";
  std::shared_ptr<const grammar::TokenTrie> trie;
  if (r.output.constrained()) {
    absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> built = Trie();
    if (!built.ok()) {
      return ApiError{400,
                      "this model's tokenizer cannot constrain output: " +
                          std::string(built.status().message()),
                      "invalid_request_error", param, ""};
    }
    trie = *built;
  }
  const int64_t room = service_.max_context() - 1 - static_cast<int64_t>(batch.prompt.size());
  auto constraint = MakeReplyConstraint(tok_, r.output, std::move(trie),
                                        std::min<int64_t>(batch.max_tokens, room),
                                        r.reasoning_budget.value_or(options_.reasoning_budget));
  if (!constraint.ok()) {
    return ApiError{400, std::string(constraint.status().message()), "invalid_request_error", param,
                    ""};
  }
  batch.constraint = *std::move(constraint);
  return std::nullopt;
}

// Built on the first request that needs it: a server whose clients never ask for tools or JSON
// does not pay for it at start (K3's vocabulary makes a trie of about a million nodes).
absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> ServerContext::Trie() const {
  std::call_once(trie_once_, [this] { trie_ = grammar::TokenTrie::Build(tok_); });
  return trie_;
}

std::optional<ApiError> ServerContext::Prompt(const CompletionRequest& r,
                                              std::vector<int32_t>& ids) const {
  if (r.endpoint == Endpoint::kChat) {
    auto rendered = RenderChat(tok_, r.messages, r.chat);
    if (!rendered.ok()) {
      return ApiError{400, std::string(rendered.status().message()), "invalid_request_error",
                      "messages", ""};
    }
    ids = *std::move(rendered);
  } else if (r.prompt_text) {
    ids = tok_.Encode(*r.prompt_text, /*allow_special=*/true);  // as `k3 generate --prompt`
  } else {
    ids = r.prompt_ids;
    for (const int32_t id : ids) {
      if (id >= vocab_size_) {
        return ApiError{
            400,
            absl::StrCat("token id ", id, " is outside the vocabulary (", vocab_size_, " ids)"),
            "invalid_request_error", "prompt", ""};
      }
    }
  }
  return std::nullopt;
}

namespace {

// Where a chat's prompt cache keeps states besides the prompt's end (PROMPT-CACHE.md section
// 2): after the first two messages (the shared head: the system prompt and the tool
// declarations) and after the last two (an agent's next turn extends the history up to the
// last message but one: a tool-choice message comes last, and moves to the end of the next).
std::vector<int64_t> MessageBoundaries(const Tokenizer& tok, std::span<const int32_t> prompt) {
  const std::optional<TokenId> end = tok.SpecialTokenId("<|end_of_msg|>");
  std::vector<int64_t> all;
  for (size_t i = 0; end && i + 1 < prompt.size(); ++i) {
    if (prompt[i] == *end) all.push_back(static_cast<int64_t>(i) + 1);
  }
  if (all.size() > 4) all.erase(all.begin() + 2, all.end() - 2);
  return all;
}

}  // namespace

std::optional<ApiError> ServerContext::Submit(const CompletionRequest& r, Submission& out) {
  BatchRequest batch;
  if (auto error = Prompt(r, batch.prompt)) return error;
  if (r.endpoint == Endpoint::kChat && service_.options().prompt_cache != nullptr) {
    batch.snapshot_at = MessageBoundaries(tok_, batch.prompt);
  }
  batch.max_tokens = r.max_tokens.value_or(options_.default_max_tokens);
  if (auto error = Constrain(r, batch)) return error;
  batch.sampler = r.sampler;
  if (!r.seeded)
    batch.sampler.seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  const std::vector<int32_t> stop_ids = r.ignore_eos ? std::vector<int32_t>{} : stop_ids_;
  batch.stop_ids = stop_ids;
  out.prompt_ids = batch.prompt;
  absl::StatusOr<std::shared_ptr<Job>> job =
      service_.Submit(std::move(batch), r.top_logprobs, r.echo);
  if (!job.ok()) {
    ApiError error = ErrorFromStatus(job.status());
    if (error.http_status == 400)
      error.param = r.endpoint == Endpoint::kChat ? "messages" : "prompt";
    return error;
  }
  out.follower = std::make_shared<Follower>(*job,
                                            r.endpoint == Endpoint::kChat
                                                ? ReplyText(tok_, r.output, stop_ids, r.stop)
                                                : ReplyText(tok_, false, stop_ids, r.stop),
                                            r.stream && r.return_progress);
  return std::nullopt;
}

}  // namespace k3::server
