// The text of a reply as the OpenAI API returns it, built token by token: for a chat, the
// response channel as `content` and the think channel as `reasoning_content`
// (core/chat_reply.h); for a completion, the bytes of the tokens. Stop ids add no text. The
// request's stop strings cut the text before the first of them; text that could still turn
// out to begin one is held back, so a stream never shows what the whole answer leaves out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/chat_reply.h"
#include "core/tokenizer/tokenizer.h"

namespace k3::server {

class ReplyText {
 public:
  struct Delta {
    std::string content, reasoning;
  };

  // `chat`: split into channels; otherwise raw token bytes.
  ReplyText(const Tokenizer& tokenizer, bool chat, std::vector<int32_t> stop_ids,
            std::vector<std::string> stop_strings);

  Delta Add(int32_t id);
  Delta Finish();                            // what is held back, at the end of the reply
  bool stopped() const { return stopped_; }  // a stop string was found: the reply is over

 private:
  Delta Release(std::string content, std::string reasoning, bool final);

  const Tokenizer& tok_;
  std::optional<ChatReplyReader> chat_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::string> stops_;
  std::string raw_pending_;  // completion: bytes of an unfinished UTF-8 character
  std::string held_;         // content not yet released (it may begin a stop string)
  bool stopped_ = false;
};

}  // namespace k3::server
