// OpenAI's routes: POST /v1/chat/completions and /v1/completions (the request parsed, handed to
// the GenerationService through ServerContext::Submit, and the reply sent whole or as
// server-sent events), and GET /v1/models.
#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "absl/strings/str_cat.h"
#include "apps/server/event_stream.h"
#include "apps/server/follower.h"
#include "apps/server/http_internal.h"
#include "apps/server/route_handlers.h"
#include "apps/server/server_context.h"
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

// What a reply of either endpoint is built from, whole or streamed.
struct CompletionReply {
  Endpoint endpoint = Endpoint::kChat;
  std::shared_ptr<Follower> follower;
  json head;  // id, object, created, model: the same in every chunk
  std::vector<int32_t> prompt_ids;
  std::optional<std::string> echo_text;  // a completion's echo: its prompt as text
  bool with_ids = false, logprobs = false, include_usage = false, log = false;
  const Tokenizer* tok = nullptr;
};

CompletionReply MakeReply(const ServerContext& server, const CompletionRequest& r,
                          Submission submission) {
  CompletionReply reply{.endpoint = r.endpoint,
                        .follower = std::move(submission.follower),
                        .prompt_ids = std::move(submission.prompt_ids),
                        .with_ids = r.return_token_ids,
                        .logprobs = r.top_logprobs >= 0,
                        .include_usage = r.include_usage,
                        .log = server.options().log_requests,
                        .tok = &server.tokenizer()};
  if (r.echo) {
    auto text = server.tokenizer().Decode(reply.prompt_ids);
    reply.echo_text = text.ok() ? *std::move(text) : std::string();
  }
  const bool chat = r.endpoint == Endpoint::kChat;
  reply.head = {{"id", NewId(r.endpoint)},
                {"object", !chat      ? "text_completion"
                           : r.stream ? "chat.completion.chunk"
                                      : "chat.completion"},
                {"created", static_cast<int64_t>(std::time(nullptr))},
                {"model", server.options().model_id}};
  return reply;
}

// What the choice of the piece with the prompt's parts (`first`) adds: the echo, the prompt's
// ids, and with them the log probabilities of the prompt's tokens; every choice's log
// probabilities when asked.
void AddPromptAndLogprobs(const CompletionReply& r, const Piece& piece, bool first, json& choice) {
  const Echo echo{r.prompt_ids, piece.prompt_logprobs};
  const bool echo_now = first && r.echo_text;
  if (echo_now) choice["text"] = *r.echo_text + piece.content;
  if (r.logprobs) {
    choice["logprobs"] =
        LogprobsJson(*r.tok, r.endpoint, piece.logprobs, echo_now ? &echo : nullptr);
  }
  if (first && r.with_ids) choice["prompt_token_ids"] = r.prompt_ids;
}

void SendWholeCompletion(const CompletionReply& r, httplib::Response& res) {
  Piece all;
  while (!r.follower->Next(all, milliseconds(1000))) {
  }
  if (absl::Status s = r.follower->status(); !s.ok()) return SendError(res, ErrorFromStatus(s));
  r.follower->LogWarnings(r.log);
  json choice = Choice(r.endpoint, false, all, r.with_ids);
  AddPromptAndLogprobs(r, all, /*first=*/true, choice);
  choice["finish_reason"] = r.follower->finish_reason();
  json answer = r.head;
  answer["choices"] = json::array({std::move(choice)});
  answer["usage"] = Usage(*r.follower);
  res.set_content(Dump(answer), "application/json");
}

// One streamed reply: a chunk for each piece of text (the first with the role, the echo and
// the prompt's ids), the prompt's progress when asked, keep-alives while nothing comes, then
// the finish reason, the usage when asked and the done marker.
class ChunkStream {
 public:
  ChunkStream(const CompletionReply& r, EventStream& out) : r_(r), out_(out) {}

  // False when the client has gone (its request is cancelled).
  bool Run() {
    if (r_.endpoint == Endpoint::kChat) SendPiece({});  // the role, as the API starts
    if (!Follow()) {
      r_.follower->job().Cancel();
      return false;
    }
    Finish();
    return true;
  }

 private:
  bool Send(json choices, const json* usage = nullptr) {
    json chunk = r_.head;
    chunk["choices"] = std::move(choices);
    if (usage) chunk["usage"] = *usage;
    return out_.Data(Dump(chunk));
  }

  bool SendPiece(const Piece& piece) {
    json choice = Choice(r_.endpoint, true, piece, r_.with_ids);
    AddPromptAndLogprobs(r_, piece, first_, choice);
    if (first_ && r_.endpoint == Endpoint::kChat)
      choice["delta"] = {{"role", "assistant"}, {"content", ""}};
    first_ = false;
    return Send(json::array({std::move(choice)}));
  }

  // llama.cpp's prompt_progress: a chunk without choices for each point.
  bool SendProgress(const Job::PromptPoint& point) {
    json chunk = r_.head;
    chunk["choices"] = json::array();
    chunk["prompt_progress"] = {{"total", r_.follower->prompt_tokens()},
                                {"cache", r_.follower->cached_tokens()},
                                {"processed", point.processed},
                                {"time_ms", static_cast<int64_t>(point.ms)}};
    return out_.Data(Dump(chunk));
  }

  // The pieces until the reply is over; false when the client has gone.
  bool Follow() {
    for (bool over = false; out_.ok() && !over;) {
      Piece piece;
      over = r_.follower->Next(piece, kHeartbeat);
      for (const Job::PromptPoint& point : piece.progress) SendProgress(point);
      if (piece.has_text() || ((r_.with_ids || r_.logprobs) && !piece.ids.empty()) ||
          (first_ && over)) {
        SendPiece(piece);
      } else if (!over && piece.progress.empty()) {
        out_.Comment("keep-alive");
      }
    }
    return out_.ok();
  }

  void Finish() {
    if (absl::Status s = r_.follower->status(); !s.ok()) {
      out_.Data(Dump(ErrorFromStatus(s).ToJson()));
      return;
    }
    r_.follower->LogWarnings(r_.log);
    json last = Choice(r_.endpoint, true, {}, false);
    if (r_.endpoint == Endpoint::kChat) last["delta"] = json::object();
    last["finish_reason"] = r_.follower->finish_reason();
    Send(json::array({std::move(last)}));
    if (r_.include_usage) {
      const json usage = Usage(*r_.follower);
      Send(json::array(), &usage);
    }
    out_.Data("[DONE]");
  }

  const CompletionReply& r_;
  EventStream& out_;
  bool first_ = true;  // the first chunk carries the prompt's ids
};

void Complete(ServerContext& server, const httplib::Request& req, httplib::Response& res,
              Endpoint endpoint) {
  ParseResult parsed = ParseCompletionRequest(req.body, endpoint);
  if (parsed.error) return SendError(res, *parsed.error);
  const CompletionRequest& r = *parsed.request;
  Submission submission;
  if (auto error = server.Submit(r, submission)) return SendError(res, *error);
  auto reply = std::make_shared<const CompletionReply>(MakeReply(server, r, std::move(submission)));
  if (!r.stream) return SendWholeCompletion(*reply, res);
  SendEventStream(
      req, res, [reply](EventStream& out) { return ChunkStream(*reply, out).Run(); },
      [follower = reply->follower](bool success) {
        if (!success) follower->job().Cancel();
      });
}

}  // namespace

void ChatCompletions(ServerContext& server, const httplib::Request& req, httplib::Response& res) {
  Complete(server, req, res, Endpoint::kChat);
}

void Completions(ServerContext& server, const httplib::Request& req, httplib::Response& res) {
  Complete(server, req, res, Endpoint::kCompletion);
}

void Models(ServerContext& server, const httplib::Request&, httplib::Response& res) {
  // The context under both names clients read it by (vLLM's, and OpenRouter's).
  const int64_t context = server.service().max_context();
  const json model = {{"id", server.options().model_id},
                      {"object", "model"},
                      {"created", 0},
                      {"owned_by", "k3"},
                      {"max_model_len", context},
                      {"context_length", context}};
  res.set_content(Dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
}

}  // namespace k3::server
