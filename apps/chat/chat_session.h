// One `k3 chat` conversation: the sequence state kept between turns, so that a turn runs only
// its new tokens (the user message or the tool results, and the assistant header) through the
// model; on a model that streams its experts from disk, re-running the history every turn would
// cost seconds per token of history. With tools (--tools FILE), a reply's calls are parsed and
// the next turn sends their results back as tool messages.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "apps/reports/run_report.h"
#include "core/model/sampler.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/text/tools/output_spec.h"
#include "core/text/tools/turn_parser.h"
#include "nlohmann/json.hpp"
#include "pipeline/batch_scheduler.h"
#include "pipeline/engine.h"

namespace k3::grammar {
class TokenTrie;
}  // namespace k3::grammar

namespace k3::cli {

struct ChatSettings {
  SamplerOptions sampler;
  int32_t n_predict = 0;
  std::string system;
  std::string history_path;
  std::string report_path;
  bool quiet = false;
  ChatOptions render;  // thinking, effort and the declared tools (--tools)
  OutputSpec output;   // what a reply may be: the tools it may call
  std::shared_ptr<const grammar::TokenTrie> trie;  // with tools: replies sample under a grammar
  int32_t reasoning_budget = -1;                   // think tokens at most (-1: no limit)
};

// The figures of one turn, for the stats line and --report-json.
struct TurnResult {
  std::vector<int32_t> fed;    // tokens run through Prefill this turn
  std::vector<int32_t> reply;  // sampled tokens, the stop token included
  int64_t position_before = 0;
  int64_t cached_tokens = 0;  // of `fed`, resumed from the prompt cache rather than run
  double prefill_seconds = 0;
  bool interrupted = false;
  std::vector<ToolCall> tool_calls;  // the reply's calls (with --tools)
};

class ChatSession {
 public:
  ChatSession(Engine& engine, const Tokenizer& tok, const ChatSettings& settings,
              std::vector<int32_t> stops, PromptCache* cache);

  absl::Status CheckTemplate() const;
  absl::Status Resume(const std::string& path);
  // A user message and the reply to it.
  absl::Status Turn(const std::string& user_text, RunReport& report, TurnResult& result);
  // The results of the last reply's calls, in their order, and the reply to them.
  absl::Status ToolResults(const std::vector<std::string>& results, RunReport& report,
                           TurnResult& result);
  void Reset();
  absl::Status SaveHistory(const std::string& path) const;

  int64_t turns() const { return turns_; }
  int64_t position() const { return state_.position(); }
  size_t messages() const { return messages_.size(); }
  // The calls of the last reply that still wait for their results.
  const std::vector<ToolCall>& pending_calls() const { return calls_; }

 private:
  absl::StatusOr<std::vector<int32_t>> NewTokens(const std::vector<ChatMessage>& fresh);
  // Runs `messages` (rendered after the conversation so far) and the reply to them.
  absl::Status Exchange(const std::vector<ChatMessage>& messages, bool with_system,
                        RunReport& report, TurnResult& result);
  absl::Status Generate(const std::vector<int32_t>& fed, int64_t head_end, RunReport& report,
                        TurnResult& result);
  // The request that runs `fed` after the conversation so far: from the longest cached state
  // beyond it, keeping the states at `head_end` (the end of the system prompt, if > 0) and a
  // token short of the prompt's end in the cache.
  BatchRequest Continue(const std::vector<int32_t>& fed, int64_t head_end, BatchEvents& events,
                        TurnResult& result);
  absl::Status Constrain(BatchRequest& request, int64_t position) const;
  void Close(const TurnResult& result, const TurnParser& parser);
  absl::Status LoadHistory(const std::string& path, std::vector<int32_t>& tokens);

  Engine& engine_;
  const Tokenizer& tok_;
  const ChatSettings& settings_;
  SequenceState state_;
  std::vector<int32_t> stops_;
  int32_t end_of_msg_ = -1;
  // Tokens that close the last reply (the last sampled token, which was never decoded, and
  // what closes its open channels and message); they run with the next turn's prefill instead
  // of costing a step now.
  std::vector<int32_t> pending_;
  std::vector<ToolCall> calls_;
  nlohmann::json messages_reply_;  // the last reply, for the history
  nlohmann::json messages_ = nlohmann::json::array();
  int64_t turns_ = 0;             // user messages so far: seeds each turn's sampler
  int64_t replies_ = 0;           // replies so far: seeds the ones to tool results
  PromptCache* cache_ = nullptr;  // --prompt-cache, if any
};

}  // namespace k3::cli
