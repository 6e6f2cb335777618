// The text of a reply as the OpenAI API returns it, built token by token: for a chat, the
// response channel as `content`, the think channel as `reasoning_content` and the tools block as
// `tool_calls` (core/text/tools/turn_parser.h); for a completion, the bytes of the tokens. Stop ids
// add no text. The request's stop strings cut the content before the first of them; content
// that could still turn out to begin one is held back, so a stream never shows what the whole
// answer leaves out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"
#include "core/text/tools/turn_parser.h"

namespace k3::server {

class ReplyText {
 public:
  struct Delta {
    std::string content, reasoning;
    std::vector<ToolCall> tool_calls;  // each call whole, once it is complete
  };

  // A chat reply whose turn `spec` describes (declared tools, tool choice, whether the prompt
  // opened the think channel). `id_seed` seeds the call ids (tests); unset, they are random.
  ReplyText(const Tokenizer& tokenizer, OutputSpec spec, std::vector<int32_t> stop_ids,
            std::vector<std::string> stop_strings, std::optional<uint64_t> id_seed = std::nullopt);
  // `chat`: a chat reply as above with OutputSpec{} (thinking on, no tools); otherwise the raw
  // bytes of a completion.
  ReplyText(const Tokenizer& tokenizer, bool chat, std::vector<int32_t> stop_ids,
            std::vector<std::string> stop_strings);

  Delta Add(int32_t id);
  Delta Finish();                            // what is held back, at the end of the reply
  bool stopped() const { return stopped_; }  // a stop string was found: the reply is over
  const std::string& matched_stop() const { return matched_stop_; }  // that string

  // A chat's parse so far, with `content` as released (cut at a stop string) and null when it
  // is empty and there are calls; finish_reason is result().FinishReason(cut at max_tokens).
  // Empty for a completion.
  ParsedTurn result() const;

 private:
  Delta Release(std::string content, std::string reasoning, bool final);

  const Tokenizer& tok_;
  std::optional<TurnParser> chat_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::string> stops_;
  std::string raw_pending_;  // completion: bytes of an unfinished UTF-8 character
  std::string held_;         // content not yet released (it may begin a stop string)
  std::string content_;      // content released so far
  bool stopped_ = false;
  std::string matched_stop_;
};

}  // namespace k3::server
