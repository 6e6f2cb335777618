// Anthropic's routes: POST /v1/messages and /v1/messages/count_tokens. The body is read into a
// CompletionRequest (anthropic_request.h), submitted and followed as an OpenAI chat is
// (ServerContext::Submit, Follower), and answered as that API answers, whole or as its events
// (MessageBuilder, anthropic_reply.h).
#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "apps/server/anthropic_reply.h"
#include "apps/server/anthropic_request.h"
#include "apps/server/event_stream.h"
#include "apps/server/follower.h"
#include "apps/server/http_internal.h"
#include "apps/server/route_handlers.h"
#include "apps/server/server_context.h"
#include "httplib.h"

namespace k3::server {
namespace {

using Json = nlohmann::ordered_json;

std::string NewMessageId() {
  static std::atomic<uint64_t> next{0};
  static const uint64_t salt = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return absl::StrCat("msg_", absl::Hex(salt, absl::kZeroPad16),
                      absl::Hex(next++, absl::kZeroPad8));
}

std::string StopReason(const Follower& f) {
  const std::string finish = f.finish_reason();
  if (finish == "tool_calls") return "tool_use";
  if (f.stop_string()) return "stop_sequence";
  return finish == "stop" ? "end_turn" : "max_tokens";
}

// One submitted message: the reply's follower and the builder of its blocks.
struct SubmittedMessage {
  std::shared_ptr<Follower> follower;
  std::shared_ptr<MessageBuilder> builder;
  int64_t input_tokens = 0;  // the whole prompt
  bool log = false;

  MessageUsage usage() const {
    const int64_t cached = follower->cached_tokens();  // 0 until the request is admitted
    return {input_tokens - cached, follower->completion_tokens(), cached};
  }
  std::string Finish() const {
    return builder->Finish(StopReason(*follower), follower->stop_string(), usage());
  }
};

void SendWholeMessage(const SubmittedMessage& m, const Submission& submission, bool with_ids,
                      const httplib::Request& req, httplib::Response& res) {
  Piece all;
  while (!m.follower->Next(all, std::chrono::milliseconds(1000))) {
  }
  if (absl::Status s = m.follower->status(); !s.ok()) {
    return SendError(req, res, ErrorFromStatus(s));
  }
  m.follower->LogWarnings(m.log);
  m.builder->Start(m.usage());
  m.builder->Add(all.reasoning, all.content, all.tool_calls);
  m.Finish();
  Json message = m.builder->message();
  if (with_ids) {
    message["prompt_token_ids"] = submission.prompt_ids;
    message["token_ids"] = all.ids;
  }
  res.set_content(DumpOrdered(message), "application/json");
}

// The message's events as its pieces come, a ping while nothing does; false when the client
// has gone (its request is cancelled).
bool StreamMessage(const SubmittedMessage& m, EventStream& out) {
  out.Write(m.builder->Start(m.usage()));
  for (bool over = false; out.ok() && !over;) {
    Piece piece;
    over = m.follower->Next(piece, kHeartbeat);
    if (piece.has_text()) {
      out.Write(m.builder->Add(piece.reasoning, piece.content, piece.tool_calls));
    } else if (!over) {
      out.Event("ping", DumpOrdered({{"type", "ping"}}));
    }
  }
  if (!out.ok()) {
    m.follower->job().Cancel();
    return false;
  }
  if (absl::Status s = m.follower->status(); !s.ok()) {
    out.Event("error", DumpOrdered(Json(AnthropicErrorJson(ErrorFromStatus(s)))));
  } else {
    m.follower->LogWarnings(m.log);
    out.Write(m.Finish());
  }
  return true;
}

}  // namespace

void Messages(ServerContext& server, const httplib::Request& req, httplib::Response& res) {
  ParseResult parsed = ParseMessagesRequest(req.body, /*count_tokens=*/false);
  if (parsed.error) return SendError(req, res, *parsed.error);
  const CompletionRequest& r = *parsed.request;
  Submission submission;
  if (auto error = server.Submit(r, submission)) return SendError(req, res, *error);
  const SubmittedMessage m{.follower = submission.follower,
                           .builder = std::make_shared<MessageBuilder>(
                               NewMessageId(), server.options().model_id, r.chat.thinking),
                           .input_tokens = static_cast<int64_t>(submission.prompt_ids.size()),
                           .log = server.options().log_requests};
  if (!r.stream) return SendWholeMessage(m, submission, r.return_token_ids, req, res);
  SendEventStream(
      req, res, [m](EventStream& out) { return StreamMessage(m, out); },
      [follower = m.follower](bool success) {
        if (!success) follower->job().Cancel();
      });
}

void CountTokens(ServerContext& server, const httplib::Request& req, httplib::Response& res) {
  ParseResult parsed = ParseMessagesRequest(req.body, /*count_tokens=*/true);
  if (parsed.error) return SendError(req, res, *parsed.error);
  std::vector<int32_t> ids;
  if (auto error = server.Prompt(*parsed.request, ids)) return SendError(req, res, *error);
  res.set_content(DumpOrdered({{"input_tokens", ids.size()}}), "application/json");
}

}  // namespace k3::server
