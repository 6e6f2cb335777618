// POST /v1/chat/completions and /v1/completions: the request parsed, its prompt rendered and
// handed to the GenerationService, and the reply sent whole or as server-sent events.
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "absl/strings/str_cat.h"
#include "apps/server/follower.h"
#include "apps/server/http_internal.h"
#include "apps/server/http_server.h"
#include "core/text/chat_template.h"
#include "core/text/grammar/token_mask.h"
#include "core/text/tools/reply_constraint.h"
#include "httplib.h"

namespace k3::server {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

std::string NewId(Endpoint endpoint) {
  static std::atomic<uint64_t> next{0};
  static const uint64_t salt = std::random_device{}();
  return absl::StrCat(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                      absl::Hex(salt, absl::kZeroPad8), absl::Hex(next++, absl::kZeroPad8));
}

// OpenAI's usage, prompt_tokens_details.cached_tokens the part the prompt cache supplied.
json Usage(const Follower& f) {
  return {{"prompt_tokens", f.prompt_tokens()},
          {"completion_tokens", f.completion_tokens()},
          {"total_tokens", f.prompt_tokens() + f.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", f.cached_tokens()}}}};
}

// OpenAI's tool_calls: in a message, or (with `index`) in a stream's delta.
json ToolCalls(const std::vector<ToolCall>& calls, bool chunk) {
  json out = json::array();
  for (const ToolCall& call : calls) {
    json c = {{"id", call.id},
              {"type", "function"},
              {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
    if (chunk) c["index"] = call.index;
    out.push_back(std::move(c));
  }
  return out;
}

// One choice of an answer or of a stream chunk.
json Choice(Endpoint endpoint, bool chunk, const Piece& piece, bool with_ids) {
  json c = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (endpoint == Endpoint::kCompletion) {
    c["text"] = piece.content;
  } else {
    json message = chunk ? json::object() : json{{"role", "assistant"}};
    if (!chunk || !piece.content.empty()) message["content"] = piece.content;
    // A reply that is only calls has null content, as the API gives it.
    if (!chunk && piece.content.empty() && !piece.tool_calls.empty()) message["content"] = nullptr;
    if (!piece.reasoning.empty()) message["reasoning_content"] = piece.reasoning;
    if (!piece.tool_calls.empty()) message["tool_calls"] = ToolCalls(piece.tool_calls, chunk);
    c[chunk ? "delta" : "message"] = std::move(message);
  }
  if (with_ids) c["token_ids"] = piece.ids;
  return c;
}

// A token's text and bytes as the API gives them (bytes: the UTF-8 of a partial character).
void TokenFields(const Tokenizer& tok, int32_t id, json& out, const char* text_key) {
  auto bytes = tok.TokenBytes(id);
  const std::string text = bytes.ok() ? std::string(*bytes) : std::string();
  out[text_key] = text;
  json list = json::array();
  for (unsigned char b : text) list.push_back(static_cast<int>(b));
  out["bytes"] = std::move(list);
}

// A completion's echo in its logprobs: the prompt's ids and the log probabilities of its
// tokens after the first.
struct Echo {
  const std::vector<int32_t>& ids;
  const std::vector<TokenLogprob>& logprobs;
};

// One token of the completions' four lists; null log probabilities for the prompt's first.
void AppendCompletionLogprob(const Tokenizer& tok, int32_t id, const TokenLogprob* lp, json& out,
                             size_t& offset) {
  auto bytes = tok.TokenBytes(id);
  const std::string text = bytes.ok() ? std::string(*bytes) : std::string();
  out["tokens"].push_back(text);
  out["text_offset"].push_back(offset);
  offset += text.size();
  if (lp == nullptr) {
    out["token_logprobs"].push_back(nullptr);
    out["top_logprobs"].push_back(nullptr);
    return;
  }
  out["token_logprobs"].push_back(lp->logprob);
  json top = json::object();
  for (const auto& [alt_id, logprob] : lp->top) {
    auto alt = tok.TokenBytes(alt_id);
    top[alt.ok() ? std::string(*alt) : std::string()] = logprob;
  }
  out["top_logprobs"].push_back(std::move(top));
}

// The choice's `logprobs`: chat's {"content": [...]} or the completions' four lists (with an
// echo, the prompt's tokens first).
json LogprobsJson(const Tokenizer& tok, Endpoint endpoint, const std::vector<TokenLogprob>& all,
                  const Echo* echo = nullptr) {
  if (endpoint == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprob& lp : all) {
      json entry = {{"logprob", lp.logprob}, {"top_logprobs", json::array()}};
      TokenFields(tok, lp.id, entry, "token");
      for (const auto& [id, logprob] : lp.top) {
        json alt = {{"logprob", logprob}};
        TokenFields(tok, id, alt, "token");
        entry["top_logprobs"].push_back(std::move(alt));
      }
      content.push_back(std::move(entry));
    }
    return {{"content", std::move(content)}};
  }
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  size_t offset = 0;
  for (size_t i = 0; echo != nullptr && i < echo->ids.size(); ++i) {
    const TokenLogprob* lp =
        i > 0 && i - 1 < echo->logprobs.size() ? &echo->logprobs[i - 1] : nullptr;
    AppendCompletionLogprob(tok, echo->ids[i], lp, out, offset);
  }
  for (const TokenLogprob& lp : all) AppendCompletionLogprob(tok, lp.id, &lp, out, offset);
  return out;
}

}  // namespace

// With tools or a JSON response format, every token of the reply is sampled under the turn's
// grammar (core/text/grammar), so that what comes back parses and validates; a thinking budget
// closes the think channel after its tokens.
std::optional<ApiError> HttpServer::Constrain(const CompletionRequest& r,
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
absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> HttpServer::Trie() const {
  std::call_once(trie_once_, [this] { trie_ = grammar::TokenTrie::Build(tok_); });
  return trie_;
}

std::optional<ApiError> HttpServer::Prompt(const CompletionRequest& r,
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

std::optional<ApiError> HttpServer::Submit(const CompletionRequest& r, Submission& out) {
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

void HttpServer::Complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
  ParseResult parsed = ParseCompletionRequest(req.body, endpoint);
  if (parsed.error) return SendError(res, *parsed.error);
  const CompletionRequest& r = *parsed.request;
  Submission submission;
  if (auto error = Submit(r, submission)) return SendError(res, *error);
  const std::shared_ptr<Follower> follower = submission.follower;
  const std::vector<int32_t> prompt_ids = std::move(submission.prompt_ids);
  std::optional<std::string> echo_text;
  if (r.echo) {
    auto text = tok_.Decode(prompt_ids);
    echo_text = text.ok() ? *std::move(text) : std::string();
  }
  json head = {{"id", NewId(endpoint)},
               {"object", endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
               {"created", static_cast<int64_t>(std::time(nullptr))},
               {"model", options_.model_id}};
  const bool with_ids = r.return_token_ids;

  if (!r.stream) {
    Piece all;
    while (!follower->Next(all, milliseconds(1000))) {
    }
    if (absl::Status s = follower->status(); !s.ok()) return SendError(res, ErrorFromStatus(s));
    follower->LogWarnings(options_.log_requests);
    json choice = Choice(endpoint, false, all, with_ids);
    const Echo echo{prompt_ids, all.prompt_logprobs};
    if (echo_text) choice["text"] = *echo_text + all.content;
    if (r.top_logprobs >= 0) {
      choice["logprobs"] = LogprobsJson(tok_, endpoint, all.logprobs, echo_text ? &echo : nullptr);
    }
    choice["finish_reason"] = follower->finish_reason();
    if (with_ids) choice["prompt_token_ids"] = prompt_ids;
    head["choices"] = json::array({std::move(choice)});
    head["usage"] = Usage(*follower);
    res.set_content(Dump(head), "application/json");
    return;
  }

  if (endpoint == Endpoint::kChat) head["object"] = "chat.completion.chunk";
  const bool include_usage = r.include_usage;
  SendEventStream(
      req, res,
      [follower, head, endpoint, with_ids, include_usage, prompt_ids, echo_text,
       log = options_.log_requests, logprobs = r.top_logprobs >= 0,
       tok = &tok_](size_t, httplib::DataSink& sink) {
        auto write = [&](std::string_view s) { return sink.write(s.data(), s.size()); };
        auto send = [&](json choices, const json* usage = nullptr) {
          json chunk = head;
          chunk["choices"] = std::move(choices);
          if (usage) chunk["usage"] = *usage;
          return write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
        };
        bool ok = true;
        bool first = true;  // the first chunk carries the prompt's ids
        auto send_piece = [&](const Piece& piece) {
          json choice = Choice(endpoint, true, piece, with_ids);
          // An echo comes before the first token, in the first chunk.
          const Echo echo{prompt_ids, piece.prompt_logprobs};
          const bool echo_now = first && echo_text;
          if (echo_now) choice["text"] = *echo_text + piece.content;
          if (logprobs) {
            choice["logprobs"] =
                LogprobsJson(*tok, endpoint, piece.logprobs, echo_now ? &echo : nullptr);
          }
          if (first && endpoint == Endpoint::kChat)
            choice["delta"] = {{"role", "assistant"}, {"content", ""}};
          if (first && with_ids) choice["prompt_token_ids"] = prompt_ids;
          first = false;
          return send(json::array({std::move(choice)}));
        };
        // llama.cpp's prompt_progress: a chunk without choices for each point.
        auto send_progress = [&](const Job::PromptPoint& point) {
          json chunk = head;
          chunk["choices"] = json::array();
          chunk["prompt_progress"] = {{"total", follower->prompt_tokens()},
                                      {"cache", follower->cached_tokens()},
                                      {"processed", point.processed},
                                      {"time_ms", static_cast<int64_t>(point.ms)}};
          return write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
        };
        if (endpoint == Endpoint::kChat) ok = send_piece({});  // the role, as the API starts
        for (bool over = false; ok && !over;) {
          Piece piece;
          over = follower->Next(piece, kHeartbeat);
          for (size_t i = 0; ok && i < piece.progress.size(); ++i)
            ok = send_progress(piece.progress[i]);
          if (!ok) break;
          if (piece.has_text() || ((with_ids || logprobs) && !piece.ids.empty()) ||
              (first && over)) {
            ok = send_piece(piece);
          } else if (!over && piece.progress.empty()) {
            ok = write(": keep-alive\n\n");
          }
        }
        if (!ok) {
          follower->job().Cancel();  // the client has gone
          return false;
        }
        if (absl::Status s = follower->status(); !s.ok()) {
          write(absl::StrCat("data: ", Dump(ErrorFromStatus(s).ToJson()), "\n\n"));
        } else {
          follower->LogWarnings(log);
          json last = Choice(endpoint, true, {}, false);
          if (endpoint == Endpoint::kChat) last["delta"] = json::object();
          last["finish_reason"] = follower->finish_reason();
          send(json::array({std::move(last)}));
          if (include_usage) {
            const json usage = Usage(*follower);
            send(json::array(), &usage);
          }
          write("data: [DONE]\n\n");
        }
        sink.done();
        return true;
      },
      [follower](bool success) {
        if (!success) follower->job().Cancel();
      });
}

}  // namespace k3::server
