#include "apps/server/follower.h"

#include <cstdio>

namespace k3::server {

namespace {

void Take(ReplyText::Delta d, Piece& piece) {
  piece.content += d.content;
  piece.reasoning += d.reasoning;
  for (ToolCall& call : d.tool_calls) piece.tool_calls.push_back(std::move(call));
}

}  // namespace

bool Follower::Next(Piece& piece, std::chrono::milliseconds timeout) {
  last_ = job_->Wait(seen_, timeout, points_seen_);
  seen_ += last_.ids.size();
  if (!last_.prompt_points.empty()) {
    points_seen_ += last_.prompt_points.size();
    piece.progress.insert(piece.progress.end(), last_.prompt_points.begin(),
                          last_.prompt_points.end());
  }
  if (!last_.prompt_logprobs.empty()) piece.prompt_logprobs = std::move(last_.prompt_logprobs);
  for (size_t i = 0; i < last_.ids.size(); ++i) {
    const int32_t id = last_.ids[i];
    if (text_.stopped()) break;
    piece.ids.push_back(id);
    if (i < last_.logprobs.size()) piece.logprobs.push_back(last_.logprobs[i]);
    ++ids_;
    Take(text_.Add(id), piece);
  }
  if (text_.stopped()) {
    job_->Cancel();  // the rest of the reply is not wanted
    return true;
  }
  if (!last_.done) return false;
  Take(text_.Finish(), piece);
  return true;
}

std::string Follower::finish_reason() const {
  return text_.result().FinishReason(!text_.stopped() && last_.finish != FinishReason::kStop);
}

std::optional<std::string> Follower::stop_string() const {
  if (!text_.stopped()) return std::nullopt;
  return text_.matched_stop();
}

void Follower::LogWarnings(bool log) const {
  if (!log) return;
  for (const std::string& w : text_.result().warnings) {
    std::fprintf(stderr, "k3 serve: reply markup dropped: %s\n", w.c_str());
  }
}

}  // namespace k3::server
