// Reads a reply of the Kimi chat template (MODEL.md 4.3) as it is sampled: the think channel
// and the response as text, without the XTML markup (special tokens, and the tag names
// between <|open|> or <|close|> and <|sep|>). The generation prompt opens the think channel,
// so a reply starts in it. Text only ever comes out as whole UTF-8 characters, so that a
// stream of deltas never splits one.
#pragma once

#include <cstdint>
#include <string>

#include "core/tokenizer/tokenizer.h"

namespace k3 {

class ChatReplyReader {
 public:
  enum class Channel { kThink, kResponse };
  struct Delta {
    std::string think, response;
    bool think_closed = false;  // this token closed the think channel
  };

  explicit ChatReplyReader(const Tokenizer& tokenizer, Channel start = Channel::kThink);

  Delta Add(int32_t id);
  // What is still held back at the end of the reply: an unfinished tag or UTF-8 character.
  Delta Flush();

 private:
  void Emit(std::string_view bytes, Delta& delta);
  std::string& Pending() { return channel_ == Channel::kThink ? think_ : response_; }

  const Tokenizer& tok_;
  int32_t open_, close_, sep_;
  Channel channel_;
  bool in_tag_ = false;
  bool closing_ = false;
  std::string tag_;
  std::string think_, response_;  // bytes not yet emitted (an unfinished character)
};

// The length of the longest prefix of `bytes` that ends on a whole UTF-8 character (invalid
// bytes count as whole: they are never going to complete).
size_t CompleteUtf8Prefix(std::string_view bytes);

}  // namespace k3
