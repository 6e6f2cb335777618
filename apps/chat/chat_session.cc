#include "apps/chat/chat_session.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "apps/chat/chat_history.h"
#include "core/text/tools/reply_constraint.h"
#include "io/file.h"

namespace k3::cli {
namespace {

using nlohmann::json;

// Streams a reply: text as it is produced, without the XTML markup; the end of the think
// channel starts a new line so that the answer stands apart from the reasoning. Each tool call
// is printed whole as it completes.
class ReplyPrinter {
 public:
  ReplyPrinter(const Tokenizer& tok, const OutputSpec& spec) : parser_(tok, spec) {}

  void Print(int32_t id) { Write(parser_.Feed(id)); }
  void Finish() { Write(parser_.Finish()); }
  const TurnParser& parser() const { return parser_; }

 private:
  static void Write(const TurnDelta& d) {
    std::fwrite(d.reasoning.data(), 1, d.reasoning.size(), stdout);
    if (d.reasoning_ended) std::fputc('\n', stdout);
    std::fwrite(d.content.data(), 1, d.content.size(), stdout);
    for (const ToolCall& call : d.tool_calls) {
      std::printf("\n[call %s %s]", call.name.c_str(), call.arguments.c_str());
    }
    std::fflush(stdout);
  }

  TurnParser parser_;
};

json CallsJson(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

}  // namespace

ChatSession::ChatSession(Engine& engine, const Tokenizer& tok, const ChatSettings& settings,
                         std::vector<int32_t> stops, PromptCache* cache)
    : engine_(engine),
      tok_(tok),
      settings_(settings),
      state_(engine.NewState()),
      stops_(std::move(stops)),
      end_of_msg_(tok.SpecialTokenId("<|end_of_msg|>").value_or(-1)),
      cache_(cache) {}

absl::Status ChatSession::CheckTemplate() const {
  const std::vector<ChatMessage> probe = {{.role = "user", .content = "hi"}};
  auto ids = RenderChat(tok_, probe, settings_.render);
  if (!ids.ok()) return ids.status();
  for (int32_t id : *ids) {
    if (id >= engine_.config().vocab_size) {
      return absl::FailedPreconditionError(
          absl::StrCat("the chat template's token ", id, " is beyond the model's vocabulary (",
                       engine_.config().vocab_size, "): tokenizer and model do not match"));
    }
  }
  if (end_of_msg_ < 0) return absl::FailedPreconditionError("the tokenizer has no <|end_of_msg|>");
  return absl::OkStatus();
}

// The closing of the last reply, then `fresh` rendered after it. The head (the tool declaration
// and the thinking-effort message) opens a conversation; later turns extend its state.
absl::StatusOr<std::vector<int32_t>> ChatSession::NewTokens(const std::vector<ChatMessage>& fresh) {
  ChatOptions options = settings_.render;
  options.head = state_.position() == 0 && pending_.empty();
  auto rendered = RenderChat(tok_, fresh, options);
  if (!rendered.ok()) return rendered.status();
  std::vector<int32_t> ids = pending_;
  ids.insert(ids.end(), rendered->begin(), rendered->end());
  return ids;
}

BatchRequest ChatSession::Continue(const std::vector<int32_t>& fed, int64_t head_end,
                                   BatchEvents& events, TurnResult& result) {
  BatchRequest request;
  request.prompt = fed;
  request.keep_final_state = true;
  request.resume = std::move(state_);
  if (cache_ != nullptr) {
    result.cached_tokens = ResumeFromPromptCache(*cache_, request);
    if (head_end > request.resume->position()) request.snapshot_at.push_back(head_end);
    events.on_prompt_state = [this](size_t, const SequenceState& s) { cache_->Store(s); };
  }
  return request;
}

// Runs the turn's new tokens and samples the reply through the batch scheduler (a batch of one,
// resuming the conversation's state), streaming it; the state comes back without the last
// sampled token, which the next turn runs first (and goes to the prompt cache: the next turn
// extends it). With tools, the reply samples under the turn's grammar.
absl::Status ChatSession::Generate(const std::vector<int32_t>& fed, int64_t head_end,
                                   RunReport& report, TurnResult& result) {
  BatchEvents events;
  BatchRequest request = Continue(fed, head_end, events, result);
  request.max_tokens = settings_.n_predict;
  request.sampler = settings_.sampler;
  request.stop_ids = stops_;
  request.sampler.seed += static_cast<uint64_t>(replies_);  // a resumed chat samples as unbroken
  if (absl::Status s =
          Constrain(request, result.position_before + static_cast<int64_t>(fed.size()));
      !s.ok()) {
    return s;
  }
  ReplyPrinter printer(tok_, settings_.output);
  bool prompt_done = false;
  events.on_prompt_end = [&](size_t, std::span<const float>, const StepMetrics& steps) {
    report.SetPrefill(fed, steps);
    result.prefill_seconds = steps.seconds;
    prompt_done = true;
  };
  events.on_token = [&](size_t, int32_t id, std::span<const float>, const StepMetrics& steps) {
    if (std::find(stops_.begin(), stops_.end(), id) == stops_.end()) printer.Print(id);
    result.reply.push_back(id);
    report.AddStep({id, "", steps});
  };
  // Ctrl-C stops the reply, never the prompt: the kept state must hold all of it.
  events.stop = [&] { return prompt_done && Interrupted(); };
  auto done = RunSequence(engine_, std::move(request), events);
  printer.Finish();
  if (!done.ok()) return done.status();
  state_ = *std::move(done->state);
  if (cache_ != nullptr) cache_->Store(state_);
  result.tool_calls = printer.parser().result().tool_calls;
  Close(result, printer.parser());
  ++replies_;
  return absl::OkStatus();
}

// The reply's constraints: with tools, the turn's grammar (a forced call ends whole within
// --n-predict and the context); with --reasoning-budget, the think channel's limit.
absl::Status ChatSession::Constrain(BatchRequest& request, int64_t position) const {
  const int64_t room = engine_.max_context() - 1 - position;
  auto constraint =
      MakeReplyConstraint(tok_, settings_.output, settings_.trie,
                          std::min<int64_t>(settings_.n_predict, room), settings_.reasoning_budget);
  if (!constraint.ok()) return constraint.status();
  request.constraint = *std::move(constraint);
  return absl::OkStatus();
}

absl::Status ChatSession::Exchange(const std::vector<ChatMessage>& messages, bool with_system,
                                   RunReport& report, TurnResult& result) {
  auto fed = NewTokens(messages);
  if (!fed.ok()) return fed.status();
  const int64_t max_context = engine_.max_context();
  if (state_.position() + static_cast<int64_t>(fed->size()) >= max_context) {
    return absl::ResourceExhaustedError(absl::StrCat("the conversation would pass --max-context ",
                                                     max_context, " (", state_.position(),
                                                     " tokens so far): /reset to start over"));
  }
  result.position_before = state_.position();
  result.fed = *fed;
  // The system prompt is the head every conversation with it shares: its state is kept apart.
  int64_t head_end = 0;
  if (with_system && cache_ != nullptr) {
    const std::vector<ChatMessage> system = {messages.front()};
    ChatOptions options = settings_.render;
    options.add_generation_prompt = false;
    auto head = RenderChat(tok_, system, options);
    if (head.ok() && head->size() < fed->size() &&
        std::equal(head->begin(), head->end(), fed->begin())) {
      head_end = static_cast<int64_t>(head->size());
    }
  }
  absl::Status s = Generate(*fed, head_end, report, result);
  if (!s.ok()) return s;
  // From here on the reply is over: a Ctrl-C now means leave, not stop the reply.
  result.interrupted = TakeInterrupt();
  return absl::OkStatus();
}

// A reply stops at a stop id, --n-predict tokens or where the context is full; the next turn is
// then refused with a notice.
absl::Status ChatSession::Turn(const std::string& user_text, RunReport& report,
                               TurnResult& result) {
  const bool with_system = state_.position() == 0 && pending_.empty() && !settings_.system.empty();
  std::vector<ChatMessage> fresh;
  if (with_system) fresh.push_back({.role = "system", .content = settings_.system});
  fresh.push_back({.role = "user", .content = user_text});
  if (absl::Status s = Exchange(fresh, with_system, report, result); !s.ok()) return s;
  if (with_system) messages_.push_back({{"role", "system"}, {"content", settings_.system}});
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  messages_.push_back(messages_reply_);
  ++turns_;
  return absl::OkStatus();
}

absl::Status ChatSession::ToolResults(const std::vector<std::string>& results, RunReport& report,
                                      TurnResult& result) {
  std::vector<ChatMessage> fresh;
  json recorded = json::array();
  for (size_t i = 0; i < results.size() && i < calls_.size(); ++i) {
    ChatMessage m{.role = "tool", .content = results[i], .name = calls_[i].name};
    m.tool_call_id = calls_[i].id;
    recorded.push_back({{"role", "tool"}, {"tool_call_id", calls_[i].id}, {"content", results[i]}});
    fresh.push_back(std::move(m));
  }
  if (absl::Status s = Exchange(fresh, false, report, result); !s.ok()) return s;
  for (json& m : recorded) messages_.push_back(std::move(m));
  messages_.push_back(messages_reply_);
  return absl::OkStatus();
}

// Records the reply and what must close it: the last token, shown but never run, unless it was
// a stop id (which the closing replaces: [EOS] does not close an XTML message), then what closes
// the channels and the message the reply left open, as a rendered history message closes.
void ChatSession::Close(const TurnResult& result, const TurnParser& parser) {
  std::vector<int32_t> shown = result.reply;
  const bool stopped =
      !shown.empty() && std::find(stops_.begin(), stops_.end(), shown.back()) != stops_.end();
  if (stopped) shown.pop_back();
  pending_.clear();
  if (!stopped && !shown.empty()) pending_.push_back(shown.back());
  const std::vector<int32_t> closing = parser.ClosingIds();
  pending_.insert(pending_.end(), closing.begin(), closing.end());
  calls_ = result.tool_calls;
  auto text = tok_.Decode(shown);
  messages_reply_ = {
      {"role", "assistant"}, {"content", text.ok() ? *text : std::string()}, {"ids", result.reply}};
  if (!calls_.empty()) messages_reply_["tool_calls"] = CallsJson(calls_);
}

void ChatSession::Reset() {
  state_ = engine_.NewState();
  pending_.clear();
  calls_.clear();
  messages_ = json::array();
  turns_ = 0;
  replies_ = 0;
}

absl::Status ChatSession::SaveHistory(const std::string& path) const {
  ChatHistory h;
  h.messages = messages_;
  h.tokens = state_.tokens();
  h.tokens.insert(h.tokens.end(), pending_.begin(), pending_.end());
  return io::WriteFileAtomically(path, SerializeChatHistory(h, engine_.config().Fingerprint()));
}

absl::Status ChatSession::LoadHistory(const std::string& path, std::vector<int32_t>& tokens) {
  auto text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto h =
      ParseChatHistory(*text, path, engine_.config().Fingerprint(), engine_.config().vocab_size);
  if (!h.ok()) return h.status();
  tokens = std::move(h->tokens);
  if (static_cast<int64_t>(tokens.size()) > engine_.max_context()) {
    return absl::FailedPreconditionError(absl::StrCat("--history ", path, ": ", tokens.size(),
                                                      " tokens exceed --max-context ",
                                                      engine_.max_context()));
  }
  messages_ = std::move(h->messages);
  return absl::OkStatus();
}

// Runs the saved conversation through the model once, which rebuilds the exact state an
// unbroken session would have (prefill and decode give bit-identical state).
absl::Status ChatSession::Resume(const std::string& path) {
  std::vector<int32_t> tokens;
  if (absl::Status s = LoadHistory(path, tokens); !s.ok()) return s;
  turns_ = std::count_if(messages_.begin(), messages_.end(),
                         [](const json& m) { return m["role"] == "user"; });
  replies_ = std::count_if(messages_.begin(), messages_.end(),
                           [](const json& m) { return m["role"] == "assistant"; });
  if (tokens.empty()) return absl::OkStatus();
  BatchEvents events;
  TurnResult unused;
  BatchRequest request = Continue(tokens, 0, events, unused);
  request.max_tokens = 0;
  auto done = RunSequence(engine_, std::move(request), events);
  if (!done.ok()) return done.status();
  state_ = *std::move(done->state);
  if (cache_ != nullptr) cache_->Store(state_);
  return absl::OkStatus();
}

}  // namespace k3::cli
