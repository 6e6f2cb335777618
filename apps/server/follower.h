// What the server's APIs share once a request is parsed: a job's tokens followed and turned into
// reply text, whichever API shapes the answer (openai_routes.cc for OpenAI's, anthropic_routes.cc
// for Anthropic's Messages).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/server/generation_service.h"
#include "apps/server/reply_text.h"

namespace k3::server {

// A stream with nothing to say for this long sends a keep-alive: clients ignore it, and a
// write that fails is how a disconnected client is noticed while its prompt still runs.
constexpr std::chrono::milliseconds kHeartbeat{500};

// The text and tokens that came since the last look.
struct Piece {
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<int32_t> ids;
  std::vector<TokenLogprob> logprobs;  // of `ids`, when the request asked
  // Of the prompt's tokens after the first, in the piece that first has a token or the end,
  // when the request asked (a completion's echo).
  std::vector<TokenLogprob> prompt_logprobs;
  // The prompt's progress since the last look, when the follower follows it.
  std::vector<Job::PromptPoint> progress;

  bool has_text() const { return !content.empty() || !reasoning.empty() || !tool_calls.empty(); }
};

// Follows one job: its tokens turned into text, a stop string ending it early.
class Follower {
 public:
  // With `progress`, Next also wakes for each point of the prompt's progress (Piece::progress).
  Follower(std::shared_ptr<Job> job, ReplyText text, bool progress = false)
      : job_(std::move(job)),
        text_(std::move(text)),
        points_seen_(progress ? 0 : Job::kNoProgress) {}

  // Reads what came within `timeout` into `piece`; true once the reply is over.
  bool Next(Piece& piece, std::chrono::milliseconds timeout);

  Job& job() { return *job_; }
  // An engine error, unless a stop string had ended the reply before it.
  absl::Status status() const { return text_.stopped() ? absl::OkStatus() : last_.status; }
  // OpenAI's finish_reason: tool_calls, stop or length.
  std::string finish_reason() const;
  // The stop string that ended the reply, if one did.
  std::optional<std::string> stop_string() const;
  // Logs why markup of the reply was dropped (a call to an undeclared tool, a cut call).
  void LogWarnings(bool log) const;

  int64_t prompt_tokens() const { return last_.prompt_tokens; }
  int64_t cached_tokens() const { return last_.cached_tokens; }
  int64_t completion_tokens() const { return static_cast<int64_t>(ids_); }

 private:
  std::shared_ptr<Job> job_;
  ReplyText text_;
  size_t seen_ = 0;
  size_t ids_ = 0;
  size_t points_seen_;  // Job::kNoProgress: not following the prompt's progress
  Job::Progress last_;
};

// A request handed to the GenerationService: its follower and its prompt's ids.
struct Submission {
  std::shared_ptr<Follower> follower;
  std::vector<int32_t> prompt_ids;
};

}  // namespace k3::server
