#include "apps/server/reply_text.h"

#include <algorithm>
#include <utility>

namespace k3::server {

ReplyText::ReplyText(const Tokenizer& tokenizer, OutputSpec spec, std::vector<int32_t> stop_ids,
                     std::vector<std::string> stop_strings, std::optional<uint64_t> id_seed)
    : tok_(tokenizer), stop_ids_(std::move(stop_ids)), stops_(std::move(stop_strings)) {
  chat_.emplace(tokenizer, std::move(spec), id_seed);
}

ReplyText::ReplyText(const Tokenizer& tokenizer, bool chat, std::vector<int32_t> stop_ids,
                     std::vector<std::string> stop_strings)
    : tok_(tokenizer), stop_ids_(std::move(stop_ids)), stops_(std::move(stop_strings)) {
  if (chat) chat_.emplace(tokenizer, OutputSpec{});
}

ReplyText::Delta ReplyText::Add(int32_t id) {
  if (stopped_ || std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    return {};
  }
  if (chat_) {
    TurnDelta d = chat_->Feed(id);
    Delta out = Release(std::move(d.content), std::move(d.reasoning), false);
    out.tool_calls = std::move(d.tool_calls);
    return out;
  }
  auto bytes = tok_.TokenBytes(id);
  if (bytes.ok()) raw_pending_.append(bytes->data(), bytes->size());
  const size_t whole = CompleteUtf8Prefix(raw_pending_);
  std::string text = raw_pending_.substr(0, whole);
  raw_pending_.erase(0, whole);
  return Release(std::move(text), {}, false);
}

ReplyText::Delta ReplyText::Finish() {
  if (stopped_) return {};
  if (chat_) {
    TurnDelta d = chat_->Finish();
    Delta out = Release(std::move(d.content), std::move(d.reasoning), true);
    out.tool_calls = std::move(d.tool_calls);
    return out;
  }
  std::string content = std::move(raw_pending_);
  raw_pending_.clear();
  return Release(std::move(content), {}, true);
}

ParsedTurn ReplyText::result() const {
  if (!chat_) return {};
  ParsedTurn turn = chat_->result();
  if (content_.empty() && !turn.tool_calls.empty()) {
    turn.content.reset();
  } else {
    turn.content = content_;
  }
  return turn;
}

ReplyText::Delta ReplyText::Release(std::string content, std::string reasoning, bool final) {
  Delta out;
  out.reasoning = std::move(reasoning);
  held_ += content;
  // The first stop string in the text ends the reply there.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) {
    if (const size_t at = held_.find(s); at < cut) {
      cut = at;
      matched_stop_ = s;
    }
  }
  if (cut != std::string::npos) {
    out.content = held_.substr(0, cut);
    content_ += out.content;
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that begins some stop string (whole characters only).
  size_t keep = 0;
  if (!final) {
    for (const std::string& s : stops_) {
      for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
        if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
          keep = n;
          break;
        }
      }
    }
  }
  size_t release = held_.size() - keep;
  release = CompleteUtf8Prefix(std::string_view(held_).substr(0, release));
  out.content = held_.substr(0, release);
  content_ += out.content;
  held_.erase(0, release);
  return out;
}

}  // namespace k3::server
