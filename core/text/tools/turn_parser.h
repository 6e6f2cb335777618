// Parses a chat reply of K3 (../shared/spec/TOOLS.md section 10) as it is sampled, token id by
// token id: the think channel as reasoning, the response as content, and the tools block as
// OpenAI tool calls. A marker is a special id; ordinary tokens that spell one are text, which a
// parser of the decoded text could not tell apart. Whatever the model emits, the parser never
// throws: malformed markup is dropped or recovered as section 10 says, never shown as content.
//
//   TurnParser parser(tok, spec);
//   for (id : sampled) Send(parser.Feed(id));   // text now, each call whole at its close
//   Send(parser.Finish());                       // at a stop, max_tokens or an interrupt
//   const ParsedTurn& turn = parser.result();
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"

namespace k3 {

struct ToolCall {
  int index = 0;          // OpenAI's: 0, 1, ... over the calls that survive (the model's ignored)
  std::string id;         // "call_" + 24 hex digits, fresh for every call
  std::string name;       // a declared tool
  std::string arguments;  // a JSON object's text, or a `json` block's text verbatim
  bool raw_arguments = false;  // `arguments` came from a `json` block, so may be any text
};

// What one id (or the end) adds. Text comes only as whole UTF-8 characters, so that a stream of
// deltas never splits one.
struct TurnDelta {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  bool reasoning_ended = false;  // this id ended the think channel
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// The whole reply: the concatenation of every delta.
struct ParsedTurn {
  std::string reasoning_content;
  std::optional<std::string> content;  // null when it is empty and there are calls
  std::vector<ToolCall> tool_calls;
  bool ended = false;                 // <|end_of_msg|> was seen
  bool tools_block_dropped = false;   // a tools block came with no tools declared or under none
  int dropped_calls = 0;              // calls to undeclared tools, and partial calls at the end
  std::vector<std::string> warnings;  // why each piece of markup was dropped, for the log

  // OpenAI's finish_reason: `tool_calls` if any call survives, else `length` when the reply was
  // cut at max_tokens, else `stop`.
  std::string FinishReason(bool cut_at_max_tokens) const;
};

class TurnParser {
 public:
  // `spec.thinking`: the prompt opened `think` (else `response`), so output starts inside it.
  // `id_seed` seeds the call ids (tests); unset, they are random.
  TurnParser(const Tokenizer& tokenizer, OutputSpec spec,
             std::optional<uint64_t> id_seed = std::nullopt);

  TurnDelta Feed(int32_t id);
  // The end of the reply: releases what is held back (an unfinished UTF-8 character) and drops
  // an unfinished header and a partial call. Feed after Finish adds nothing.
  TurnDelta Finish();

  const ParsedTurn& result() const { return result_; }

  // The ids that close the turn from here the way a rendered history message closes (a header
  // the model began, channels, tools block and message, then <|end_of_msg|>), for a reply cut
  // short; none after <|end_of_msg|>. The same before and after Finish. Tag names are encoded
  // as ordinary text.
  std::vector<int32_t> ClosingIds() const;

 private:
  enum class State {
    kThink,
    kAfterThink,  // the think channel closed; the response has not opened
    kResponse,
    kAfterResponse,
    kTools,  // inside a tools block, between calls
    kCall,   // inside a call, between its arguments
    kArgument,
    kJson,
    kAfterTools,
    kMessageClosed,  // <|close|>message<|sep|>: only <|end_of_msg|> may follow
    kEnded,
  };
  struct Argument {
    std::string key, value;  // value: JSON text
  };
  struct PendingCall {
    std::string name;
    std::vector<Argument> arguments;
    std::optional<std::string> json;  // a `json` block's body
  };

  enum class Channel { kReasoning, kContent, kNone };
  static Channel ChannelOf(State s);

  // Moves to `s`; text held back for a channel that ends goes out with `delta`.
  void SetState(State s, TurnDelta& delta);
  bool InChannels() const;
  bool InToolsBlock() const;
  void Text(std::string_view bytes, TurnDelta& delta);
  // Moves the text held back for the current channel into `delta` (all of it at the channel's
  // end, else whole characters only).
  void Release(TurnDelta& delta, bool all);
  void Header(TurnDelta& delta);
  void Open(std::string_view tag, std::string_view attrs, TurnDelta& delta);
  void Close(std::string_view tag, TurnDelta& delta);
  void OpenTools(TurnDelta& delta);
  void OpenCall(std::string_view attrs);
  void EndArgument();  // the open argument or json block
  void EndCall(TurnDelta& delta);
  void DropPartialCall(std::string_view why);
  void Settle();  // content becomes null when it is empty and there are calls
  void Warn(std::string message);
  std::string NewCallId();
  bool Declared(std::string_view name) const;

  const Tokenizer* tok_;
  OutputSpec spec_;
  std::mt19937_64 ids_;
  int32_t open_, close_, sep_, end_;
  State state_;
  bool finished_ = false;
  // A header: from <|open|> or <|close|> to <|sep|>.
  bool in_header_ = false, closing_ = false, header_overflow_ = false;
  std::string header_;
  bool dropping_tools_ = false;  // this tools block is dropped whole
  std::string pending_;          // text of the current channel not yet released
  std::string body_;             // the open argument's or json block's body
  Argument argument_;            // the open argument: key, and its type in `value`
  std::optional<PendingCall> call_;
  ParsedTurn result_;
};

// The length of the longest prefix of `bytes` that ends on a whole UTF-8 character (invalid
// bytes count as whole: they are never going to complete).
size_t CompleteUtf8Prefix(std::string_view bytes);

// `attrs` of a header as section 10 reads them: every `(\w+)="([^"]*)"`, values unescaped
// (&quot; then &amp;), in order.
std::vector<std::pair<std::string, std::string>> ParseHeaderAttributes(std::string_view attrs);

}  // namespace k3
