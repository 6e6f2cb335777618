#include "core/chat_reply.h"

namespace k3 {

size_t CompleteUtf8Prefix(std::string_view bytes) {
  // Only the last three bytes can start an unfinished character.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

ChatReplyReader::ChatReplyReader(const Tokenizer& tokenizer, Channel start)
    : tok_(tokenizer),
      open_(tokenizer.SpecialTokenId("<|open|>").value_or(-1)),
      close_(tokenizer.SpecialTokenId("<|close|>").value_or(-1)),
      sep_(tokenizer.SpecialTokenId("<|sep|>").value_or(-1)),
      channel_(start) {}

void ChatReplyReader::Emit(std::string_view bytes, Delta& delta) {
  std::string& pending = Pending();
  pending.append(bytes);
  const size_t whole = CompleteUtf8Prefix(pending);
  (channel_ == Channel::kThink ? delta.think : delta.response).append(pending, 0, whole);
  pending.erase(0, whole);
}

ChatReplyReader::Delta ChatReplyReader::Add(int32_t id) {
  Delta delta;
  if (id == open_ || id == close_) {
    if (in_tag_) Emit(tag_, delta);
    in_tag_ = true;
    closing_ = id == close_;
    tag_.clear();
  } else if (id == sep_ && in_tag_) {
    in_tag_ = false;
    if (tag_.rfind("think", 0) == 0) {
      delta.think_closed = closing_ && channel_ == Channel::kThink;
      if (delta.think_closed) Emit({}, delta);
      channel_ = closing_ ? Channel::kResponse : Channel::kThink;
    } else if (tag_.rfind("response", 0) == 0) {
      channel_ = Channel::kResponse;
    }
  } else if (!tok_.IsSpecial(id)) {
    auto bytes = tok_.TokenBytes(id);
    if (!bytes.ok()) return delta;
    if (!in_tag_) {
      Emit(*bytes, delta);
      return delta;
    }
    tag_.append(bytes->data(), bytes->size());
    // A tag name is a word or two; anything longer was text after a stray marker.
    if (tag_.size() > 64) {
      in_tag_ = false;
      Emit(tag_, delta);
    }
  }
  return delta;
}

ChatReplyReader::Delta ChatReplyReader::Flush() {
  Delta delta;
  if (in_tag_) {
    in_tag_ = false;
    Emit(tag_, delta);
  }
  delta.think += think_;
  delta.response += response_;
  think_.clear();
  response_.clear();
  return delta;
}

}  // namespace k3
