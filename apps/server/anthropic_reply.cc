// POST /v1/messages and /v1/messages/count_tokens: Anthropic's body read into a
// CompletionRequest (anthropic_request.h), submitted and followed as an OpenAI chat is
// (HttpServer::Submit, Follower), and answered as that API answers, whole or as its events.
#include "apps/server/anthropic_reply.h"

#include <atomic>
#include <random>

#include "absl/strings/str_cat.h"
#include "apps/server/anthropic_request.h"
#include "apps/server/follower.h"
#include "apps/server/http_internal.h"
#include "apps/server/http_server.h"
#include "httplib.h"

namespace k3::server {

namespace {

// Ordered, as the message is (anthropic_reply.h).
using Json = nlohmann::ordered_json;

// As Dump (http_internal.h), for ordered JSON.
std::string DumpOrdered(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Event(std::string_view name, const Json& data) {
  return absl::StrCat("event: ", std::string(name), "\ndata: ", DumpOrdered(data), "\n\n");
}

// A call's arguments as the object a tool_use's input is; text that is not one (only a tool
// declared with strict false can give it) as an empty object rather than a broken block.
Json Input(const ToolCall& call) {
  Json input = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  return input.is_object() ? input : Json::object();
}

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

}  // namespace

Json MessageUsage::ToJson() const {
  return {{"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"cache_read_input_tokens", cache_read_input_tokens},
          {"cache_creation_input_tokens", 0}};
}

std::string ToolUseId(const std::string& call_id) {
  const std::string prefix = "call_";
  return "toolu_" + (call_id.starts_with(prefix) ? call_id.substr(prefix.size()) : call_id);
}

std::string ThinkingSignature(std::string_view thinking) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (const unsigned char c : thinking) h = (h ^ c) * 1099511628211ull;
  return absl::StrCat("k3-", absl::Hex(h, absl::kZeroPad16));
}

MessageBuilder::MessageBuilder(std::string id, std::string model, bool thinking)
    : message_({{"id", std::move(id)},
                {"type", "message"},
                {"role", "assistant"},
                {"model", std::move(model)},
                {"content", Json::array()},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage", MessageUsage{}.ToJson()}}),
      thinking_(thinking) {}

std::string MessageBuilder::Start(const MessageUsage& usage) {
  message_["usage"] = usage.ToJson();
  std::string out = Event("message_start", {{"type", "message_start"}, {"message", message_}});
  if (thinking_)
    out += Enter("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
  return out;
}

std::string MessageBuilder::Add(std::string_view reasoning, std::string_view content,
                                const std::vector<ToolCall>& calls) {
  std::string out;
  if (!reasoning.empty()) {
    out += Enter("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    message_["content"].back()["thinking"] =
        message_["content"].back()["thinking"].get<std::string>() + std::string(reasoning);
    out += Delta({{"type", "thinking_delta"}, {"thinking", reasoning}});
  }
  if (!content.empty()) {
    out += Enter("text", {{"type", "text"}, {"text", ""}});
    message_["content"].back()["text"] =
        message_["content"].back()["text"].get<std::string>() + std::string(content);
    out += Delta({{"type", "text_delta"}, {"text", content}});
  }
  for (const ToolCall& call : calls) {
    out += Close();  // each call a block of its own
    out += Enter("tool_use", {{"type", "tool_use"},
                              {"id", ToolUseId(call.id)},
                              {"name", call.name},
                              {"input", Json::object()}});
    const Json input = Input(call);
    message_["content"].back()["input"] = input;
    out += Delta({{"type", "input_json_delta"}, {"partial_json", DumpOrdered(input)}});
    out += Close();
  }
  return out;
}

std::string MessageBuilder::Finish(const std::string& stop_reason,
                                   const std::optional<std::string>& stop,
                                   const MessageUsage& usage) {
  std::string out = Close();
  message_["stop_reason"] = stop_reason;
  message_["stop_sequence"] = stop ? Json(*stop) : Json(nullptr);
  message_["usage"] = usage.ToJson();
  out += Event(
      "message_delta",
      {{"type", "message_delta"},
       {"delta", {{"stop_reason", stop_reason}, {"stop_sequence", message_["stop_sequence"]}}},
       {"usage", message_["usage"]}});
  out += Event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string MessageBuilder::Enter(const std::string& type, Json block) {
  if (open_ == type) return "";
  std::string out = Close();
  message_["content"].push_back(block);
  open_ = type;
  out += Event("content_block_start", {{"type", "content_block_start"},
                                       {"index", message_["content"].size() - 1},
                                       {"content_block", std::move(block)}});
  return out;
}

std::string MessageBuilder::Close() {
  if (open_.empty()) return "";
  std::string out;
  Json& block = message_["content"].back();
  // The signature comes last, once the thinking text is whole, as the API sends it.
  if (open_ == "thinking") {
    block["signature"] = ThinkingSignature(block["thinking"].get<std::string>());
    out += Delta({{"type", "signature_delta"}, {"signature", block["signature"]}});
  }
  out += Event("content_block_stop",
               {{"type", "content_block_stop"}, {"index", message_["content"].size() - 1}});
  open_.clear();
  return out;
}

std::string MessageBuilder::Delta(Json delta) {
  return Event("content_block_delta", {{"type", "content_block_delta"},
                                       {"index", message_["content"].size() - 1},
                                       {"delta", std::move(delta)}});
}

void HttpServer::Messages(const httplib::Request& req, httplib::Response& res) {
  ParseResult parsed = ParseMessagesRequest(req.body, /*count_tokens=*/false);
  if (parsed.error) return SendError(req, res, *parsed.error);
  const CompletionRequest& r = *parsed.request;
  Submission submission;
  if (auto error = Submit(r, submission)) return SendError(req, res, *error);
  const std::shared_ptr<Follower> follower = submission.follower;
  auto builder =
      std::make_shared<MessageBuilder>(NewMessageId(), options_.model_id, r.chat.thinking);
  const auto input_tokens = static_cast<int64_t>(submission.prompt_ids.size());
  auto usage = [follower, input_tokens] {
    const int64_t cached = follower->cached_tokens();  // 0 until the request is admitted
    return MessageUsage{input_tokens - cached, follower->completion_tokens(), cached};
  };

  if (!r.stream) {
    Piece all;
    while (!follower->Next(all, std::chrono::milliseconds(1000))) {
    }
    if (absl::Status s = follower->status(); !s.ok()) {
      return SendError(req, res, ErrorFromStatus(s));
    }
    follower->LogWarnings(options_.log_requests);
    builder->Start(usage());
    builder->Add(all.reasoning, all.content, all.tool_calls);
    builder->Finish(StopReason(*follower), follower->stop_string(), usage());
    Json message = builder->message();
    if (r.return_token_ids) {
      message["prompt_token_ids"] = submission.prompt_ids;
      message["token_ids"] = all.ids;
    }
    res.set_content(DumpOrdered(message), "application/json");
    return;
  }

  SendEventStream(
      req, res,
      [follower, builder, usage, log = options_.log_requests](size_t, httplib::DataSink& sink) {
        auto write = [&](std::string_view s) { return sink.write(s.data(), s.size()); };
        bool ok = write(builder->Start(usage()));
        for (bool over = false; ok && !over;) {
          Piece piece;
          over = follower->Next(piece, kHeartbeat);
          if (piece.has_text()) {
            ok = write(builder->Add(piece.reasoning, piece.content, piece.tool_calls));
          } else if (!over) {
            ok = write(Event("ping", {{"type", "ping"}}));
          }
        }
        if (!ok) {
          follower->job().Cancel();  // the client has gone
          return false;
        }
        if (absl::Status s = follower->status(); !s.ok()) {
          write(Event("error", Json(AnthropicErrorJson(ErrorFromStatus(s)))));
        } else {
          follower->LogWarnings(log);
          write(builder->Finish(StopReason(*follower), follower->stop_string(), usage()));
        }
        sink.done();
        return true;
      },
      [follower](bool success) {
        if (!success) follower->job().Cancel();
      });
}

void HttpServer::CountTokens(const httplib::Request& req, httplib::Response& res) {
  ParseResult parsed = ParseMessagesRequest(req.body, /*count_tokens=*/true);
  if (parsed.error) return SendError(req, res, *parsed.error);
  std::vector<int32_t> ids;
  if (auto error = Prompt(*parsed.request, ids)) return SendError(req, res, *error);
  res.set_content(DumpOrdered({{"input_tokens", ids.size()}}), "application/json");
}

}  // namespace k3::server
