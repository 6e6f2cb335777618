// k3 chat: a conversation in the terminal with the Kimi chat template. The sequence state is
// kept between turns, so a turn runs only its new tokens (the user message and the assistant
// header) through the model: on a model that streams its experts from disk, re-running the
// history every turn would cost seconds per token of history.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "apps/chat_history.h"
#include "apps/commands.h"
#include "apps/engine_flags.h"
#include "apps/flags.h"
#include "apps/generate_options.h"
#include "apps/prompt_cache_flags.h"
#include "apps/run_report.h"
#include "core/chat_template.h"
#include "core/sampler.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tools/turn_parser.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "pipeline/batch_scheduler.h"
#include "pipeline/engine.h"

namespace k3::cli {
namespace {

using nlohmann::json;

constexpr char kChatName[] = "chat";

// Reads stdin a line at a time with read(2), because std::getline retries EINTR and so
// could not notice Ctrl-C at the prompt.
class LineReader {
 public:
  enum class Result { kLine, kEof, kInterrupted, kError };

  Result Next(std::string& line) {
    for (;;) {
      if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        return Result::kLine;
      }
      if (eof_) {
        if (buffer_.empty()) return Result::kEof;
        line = std::move(buffer_);
        buffer_.clear();
        return Result::kLine;
      }
      if (Interrupted()) return Result::kInterrupted;
      char chunk[4096];
      const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof(chunk));
      if (n > 0) {
        buffer_.append(chunk, static_cast<size_t>(n));
      } else if (n == 0) {
        eof_ = true;
      } else if (errno != EINTR) {
        return Result::kError;
      }
    }
  }

 private:
  std::string buffer_;
  bool eof_ = false;
};

// Streams a reply: text as it is produced, without the XTML markup; the end of the think
// channel starts a new line so that the answer stands apart from the reasoning. No tools are
// declared, so a tools block shows nothing.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(const Tokenizer& tok) : parser_(tok, OutputSpec{}) {}
  ~ReplyPrinter() { Write(parser_.Finish()); }

  void Print(int32_t id) { Write(parser_.Feed(id)); }

 private:
  static void Write(const TurnDelta& d) {
    std::fwrite(d.reasoning.data(), 1, d.reasoning.size(), stdout);
    if (d.reasoning_ended) std::fputc('\n', stdout);
    std::fwrite(d.content.data(), 1, d.content.size(), stdout);
    std::fflush(stdout);
  }

  TurnParser parser_;
};

struct ChatSettings {
  SamplerOptions sampler;
  int32_t n_predict = 0;
  std::string system;
  std::string history_path;
  std::string report_path;
  bool quiet = false;
};

// Refuses a --history in a directory that does not exist now, rather than after the first
// reply, when the save would fail.
absl::Status CheckHistoryPath(const std::string& path) {
  if (path.empty() || io::FileExists(path)) return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  if (io::IsDirectory(parent.string())) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("--history ", path, ": directory ", parent.string(), " does not exist"));
}

absl::StatusOr<ChatSettings> ReadSettings() {
  ChatSettings s;
  s.n_predict = absl::GetFlag(FLAGS_n_predict);
  if (s.n_predict < 0) return absl::InvalidArgumentError("--n-predict must be >= 0");
  auto sampler = ReadSampler();
  if (!sampler.ok()) return sampler.status();
  s.sampler = *sampler;
  s.system = absl::GetFlag(FLAGS_system);
  s.history_path = absl::GetFlag(FLAGS_history);
  s.report_path = absl::GetFlag(FLAGS_report_json);
  s.quiet = absl::GetFlag(FLAGS_quiet);
  if (absl::Status st = CheckHistoryPath(s.history_path); !st.ok()) return st;
  return s;
}

// The figures of one turn, for the stats line and --report-json.
struct TurnResult {
  std::vector<int32_t> fed;    // tokens run through Prefill this turn
  std::vector<int32_t> reply;  // sampled tokens, the stop token included
  int64_t position_before = 0;
  int64_t cached_tokens = 0;  // of `fed`, resumed from the prompt cache rather than run
  double prefill_seconds = 0;
  bool interrupted = false;
};

class ChatSession {
 public:
  ChatSession(Engine& engine, const Tokenizer& tok, const ChatSettings& settings,
              std::vector<int32_t> stops, PromptCache* cache)
      : engine_(engine),
        tok_(tok),
        settings_(settings),
        state_(engine.NewState()),
        stops_(std::move(stops)),
        end_of_msg_(tok.SpecialTokenId("<|end_of_msg|>").value_or(-1)),
        cache_(cache) {}

  absl::Status CheckTemplate() const;
  absl::Status Resume(const std::string& path);
  absl::Status Turn(const std::string& user_text, RunReport& report, TurnResult& result);
  void Reset();
  absl::Status SaveHistory(const std::string& path) const;

  int64_t turns() const { return turns_; }
  int64_t position() const { return state_.position(); }
  size_t messages() const { return messages_.size(); }

 private:
  absl::StatusOr<std::vector<int32_t>> NewTokens(const std::string& user_text, bool with_system);
  absl::Status Generate(const std::vector<int32_t>& fed, int64_t head_end, RunReport& report,
                        TurnResult& result);
  // The request that runs `fed` after the conversation so far: from the longest cached state
  // beyond it, keeping the states at `head_end` (the end of the system prompt, if > 0) and a
  // token short of the prompt's end in the cache.
  BatchRequest Continue(const std::vector<int32_t>& fed, int64_t head_end, SequenceHooks& hooks,
                        TurnResult& result);
  void Close(const TurnResult& result);
  absl::Status LoadHistory(const std::string& path, std::vector<int32_t>& tokens);

  Engine& engine_;
  const Tokenizer& tok_;
  const ChatSettings& settings_;
  SequenceState state_;
  std::vector<int32_t> stops_;
  int32_t end_of_msg_ = -1;
  // Tokens that close the last reply (the last sampled token, which was never decoded, and
  // <|end_of_msg|>); they run with the next turn's prefill instead of costing a step now.
  std::vector<int32_t> pending_;
  json messages_ = json::array();
  int64_t turns_ = 0;             // user messages so far: seeds each turn's sampler
  PromptCache* cache_ = nullptr;  // --prompt-cache, if any
};

absl::Status ChatSession::CheckTemplate() const {
  const std::vector<ChatMessage> probe = {{.role = "user", .content = "hi"}};
  auto ids = RenderChat(tok_, probe);
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

absl::StatusOr<std::vector<int32_t>> ChatSession::NewTokens(const std::string& user_text,
                                                            bool with_system) {
  std::vector<ChatMessage> fresh;
  if (with_system) fresh.push_back({.role = "system", .content = settings_.system});
  fresh.push_back({.role = "user", .content = user_text});
  // The head (the thinking-effort message) opens a conversation; later turns extend its state.
  const bool head = state_.position() == 0 && pending_.empty();
  auto rendered = RenderChat(tok_, fresh, {.head = head});
  if (!rendered.ok()) return rendered.status();
  std::vector<int32_t> ids = pending_;
  ids.insert(ids.end(), rendered->begin(), rendered->end());
  return ids;
}

BatchRequest ChatSession::Continue(const std::vector<int32_t>& fed, int64_t head_end,
                                   SequenceHooks& hooks, TurnResult& result) {
  BatchRequest request;
  request.prompt = fed;
  request.keep_final_state = true;
  request.resume = std::move(state_);
  if (cache_ != nullptr) {
    result.cached_tokens = ResumeFromPromptCache(*cache_, request);
    if (head_end > request.resume->position()) request.snapshot_at.push_back(head_end);
    hooks.on_prompt_state = [this](size_t, const SequenceState& s) { cache_->Store(s); };
  }
  return request;
}

// Runs the turn's new tokens and samples the reply through the batch scheduler (a batch of one,
// resuming the conversation's state), streaming it; the state comes back without the last
// sampled token, which the next turn runs first (and goes to the prompt cache: the next turn
// extends it).
absl::Status ChatSession::Generate(const std::vector<int32_t>& fed, int64_t head_end,
                                   RunReport& report, TurnResult& result) {
  SequenceHooks hooks;
  BatchRequest request = Continue(fed, head_end, hooks, result);
  request.max_tokens = settings_.n_predict;
  request.sampler = settings_.sampler;
  request.stop_ids = stops_;
  request.sampler.seed += static_cast<uint64_t>(turns_);  // a resumed chat samples as unbroken
  ReplyPrinter printer(tok_);
  bool prompt_done = false;
  hooks.on_prompt_end = [&](std::span<const float>, const StepMetrics& steps) {
    report.SetPrefill(fed, steps);
    result.prefill_seconds = steps.seconds;
    prompt_done = true;
  };
  hooks.on_token = [&](int32_t id, std::span<const float>, const StepMetrics& steps) {
    if (std::find(stops_.begin(), stops_.end(), id) == stops_.end()) printer.Print(id);
    result.reply.push_back(id);
    report.AddStep({id, "", steps});
  };
  // Ctrl-C stops the reply, never the prompt: the kept state must hold all of it.
  hooks.stop = [&] { return prompt_done && Interrupted(); };
  auto done = RunSequence(engine_, std::move(request), hooks);
  if (!done.ok()) return done.status();
  state_ = *std::move(done->state);
  if (cache_ != nullptr) cache_->Store(state_);
  return absl::OkStatus();
}

// A reply stops at a stop id, --n-predict tokens or where the context is full; the next turn is
// then refused with a notice.
absl::Status ChatSession::Turn(const std::string& user_text, RunReport& report,
                               TurnResult& result) {
  const bool with_system = state_.position() == 0 && pending_.empty() && !settings_.system.empty();
  auto fed = NewTokens(user_text, with_system);
  if (!fed.ok()) return fed.status();
  const int64_t max_context = engine_.options().max_context;
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
    const std::vector<ChatMessage> system = {{.role = "system", .content = settings_.system}};
    auto head = RenderChat(tok_, system, {.add_generation_prompt = false});
    if (head.ok() && head->size() < fed->size() &&
        std::equal(head->begin(), head->end(), fed->begin())) {
      head_end = static_cast<int64_t>(head->size());
    }
  }
  absl::Status s = Generate(*fed, head_end, report, result);
  if (!s.ok()) return s;
  pending_.clear();
  if (with_system) messages_.push_back({{"role", "system"}, {"content", settings_.system}});
  // From here on the reply is over: a Ctrl-C now means leave, not stop the reply.
  result.interrupted = TakeInterrupt();
  messages_.push_back({{"role", "user"}, {"content", user_text}});
  Close(result);
  ++turns_;
  return s;
}

// Records the reply and what must close it: a stop token ends the message (as <|end_of_msg|>,
// since [EOS] does not close an XTML message); otherwise the last token, shown but never
// decoded, still has to go in first.
void ChatSession::Close(const TurnResult& result) {
  std::vector<int32_t> shown = result.reply;
  const bool stopped =
      !shown.empty() && std::find(stops_.begin(), stops_.end(), shown.back()) != stops_.end();
  if (stopped) shown.pop_back();
  if (!stopped && !shown.empty()) pending_.push_back(shown.back());
  pending_.push_back(end_of_msg_);
  auto text = tok_.Decode(shown);
  messages_.push_back({{"role", "assistant"},
                       {"content", text.ok() ? *text : std::string()},
                       {"ids", result.reply}});
}

void ChatSession::Reset() {
  state_ = engine_.NewState();
  pending_.clear();
  messages_ = json::array();
  turns_ = 0;
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
  if (static_cast<int64_t>(tokens.size()) > engine_.options().max_context) {
    return absl::FailedPreconditionError(absl::StrCat("--history ", path, ": ", tokens.size(),
                                                      " tokens exceed --max-context ",
                                                      engine_.options().max_context));
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
  if (tokens.empty()) return absl::OkStatus();
  SequenceHooks hooks;
  TurnResult unused;
  BatchRequest request = Continue(tokens, 0, hooks, unused);
  request.max_tokens = 0;
  auto done = RunSequence(engine_, std::move(request), hooks);
  if (!done.ok()) return done.status();
  state_ = *std::move(done->state);
  if (cache_ != nullptr) cache_->Store(state_);
  return absl::OkStatus();
}

void PrintTurnStats(const TurnResult& t, const RunReport& report, int64_t turn) {
  const std::string cached =
      t.cached_tokens > 0 ? absl::StrCat(", ", t.cached_tokens, " from the prompt cache") : "";
  std::fprintf(stderr, "[turn %lld: %zu tokens in (%.3f s%s), %zu tokens out, %.4f s/token%s]\n",
               static_cast<long long>(turn), t.fed.size(), t.prefill_seconds, cached.c_str(),
               t.reply.size(), report.median_decode_seconds(),
               t.interrupted ? ", interrupted" : "");
}

// Runs one user message: streams the reply, then the stats line, the history and the report.
// A turn that would overflow the context is refused with a notice and the chat goes on.
int RunTurn(ChatSession& chat, const Engine& engine, const ChatSettings& s, const std::string& line,
            json& reports) {
  RunReport report(/*print_steps=*/false);
  TurnResult t;
  const absl::Status status = chat.Turn(line, report, t);
  if (status.code() == absl::StatusCode::kResourceExhausted && t.fed.empty()) {
    std::fprintf(stderr, "k3 chat: %s\n", std::string(status.message()).c_str());
    return kExitOk;
  }
  std::printf("\n");
  std::fflush(stdout);
  if (!status.ok()) return ReportError(kChatName, status);
  if (!s.quiet) PrintTurnStats(t, report, chat.turns());
  if (!s.history_path.empty()) {
    if (absl::Status h = chat.SaveHistory(s.history_path); !h.ok())
      return ReportError(kChatName, h);
  }
  if (!s.report_path.empty()) {
    json turn = report.ToJson(engine);
    turn["turn"] = chat.turns();
    turn["position_before"] = t.position_before;
    turn["cached_tokens"] = t.cached_tokens;
    turn["interrupted"] = t.interrupted;
    reports.push_back(std::move(turn));
    if (absl::Status r = io::WriteFileAtomically(s.report_path, reports.dump(1) + "\n"); !r.ok())
      return ReportError(kChatName, r);
  }
  return kExitOk;
}

// /reset forgets the conversation; the cleared history is saved at once so that a resumed
// session does not bring it back.
int ResetConversation(ChatSession& chat, const ChatSettings& s) {
  chat.Reset();
  if (!s.quiet) std::fprintf(stderr, "[conversation cleared]\n");
  if (s.history_path.empty()) return kExitOk;
  if (absl::Status h = chat.SaveHistory(s.history_path); !h.ok()) return ReportError(kChatName, h);
  return kExitOk;
}

// Reads user lines until /exit, end of input or Ctrl-C at the prompt (exit 130).
int Converse(ChatSession& chat, const Engine& engine, const ChatSettings& s) {
  const bool interactive = ::isatty(STDIN_FILENO) == 1;
  if (interactive && !s.quiet) {
    std::fprintf(stderr,
                 "type a message; /reset starts over, /exit or Ctrl-D leaves, Ctrl-C "
                 "stops a reply\n");
  }
  LineReader reader;
  json reports = json::array();
  std::string line;
  for (;;) {
    if (interactive) std::printf("> ");
    std::fflush(stdout);
    const LineReader::Result r = reader.Next(line);
    if (r == LineReader::Result::kEof) return kExitOk;
    if (r == LineReader::Result::kInterrupted) return kExitInterrupted;
    if (r == LineReader::Result::kError) {
      return ReportError(
          kChatName, absl::InternalError(absl::StrCat("reading stdin: ", std::strerror(errno))));
    }
    if (line == "/exit" || line == "/quit") return kExitOk;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const int rc =
        line == "/reset" ? ResetConversation(chat, s) : RunTurn(chat, engine, s, line, reports);
    if (rc != kExitOk) return rc;
  }
}

absl::Status ResumeIfSaved(ChatSession& chat, const ChatSettings& s) {
  if (s.history_path.empty() || !io::FileExists(s.history_path)) return absl::OkStatus();
  if (absl::Status st = chat.Resume(s.history_path); !st.ok()) return st;
  if (!s.quiet) {
    std::fprintf(stderr, "[resumed %s: %zu messages, %lld tokens]\n", s.history_path.c_str(),
                 chat.messages(), static_cast<long long>(chat.position()));
  }
  return absl::OkStatus();
}

int RunChat(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kChatName, "unexpected argument " + positional[0]);
  auto settings = ReadSettings();
  if (!settings.ok()) return ReportError(kChatName, settings.status());
  auto options = EngineOptionsFromFlags();
  if (!options.ok()) return ReportError(kChatName, options.status());
  auto tok = FindTokenizer(options->model_dir, /*required=*/true);
  if (!tok.ok()) return ReportError(kChatName, tok.status());
  auto engine = Engine::Open(*options);
  if (!engine.ok()) return ReportError(kChatName, engine.status());
  auto stops = StopIds((*engine)->config(), *tok);
  if (!stops.ok()) return ReportError(kChatName, stops.status());
  auto cache = PromptCacheFromFlags(**engine, kChatName, 0);
  if (!cache.ok()) return ReportError(kChatName, cache.status());
  ChatSession chat(**engine, **tok, *settings, *std::move(stops), cache->get());
  if (absl::Status s = chat.CheckTemplate(); !s.ok()) return ReportError(kChatName, s);
  if (!settings->quiet) std::fprintf(stderr, "%s", PlanText(**engine).c_str());
  if (absl::Status s = ResumeIfSaved(chat, *settings); !s.ok()) return ReportError(kChatName, s);
  InstallInterruptHandler();
  return Converse(chat, **engine, *settings);
}

}  // namespace

const Subcommand& ChatCommand() {
  static const Subcommand kCommand{
      kChatName,
      "talk with the model in the terminal (Kimi chat template)",
      "chat [--model DIR] [--system TEXT] [--history FILE] [--n-predict N]\n"
      "            [--greedy | --temp X --top-p P --top-k K --seed S] [--report-json FILE]\n"
      "            [--prompt-cache DIR] [engine flags as for k3 generate]",
      "A conversation with the Kimi K3 chat template. Each line read from stdin (a terminal or\n"
      "a pipe) is a user message; the reply streams to stdout and ends at <|end_of_msg|>,\n"
      "[EOS] or --n-predict tokens. The sequence state is kept between turns, so a turn runs\n"
      "only its own new tokens through the model, never the history again. Without --model it\n"
      "uses the built-in demo model. Greedy unless --temp is given; turn N samples with seed\n"
      "--seed + N - 1.\n\n"
      "  /reset   forget the conversation (the --system message comes back with the next turn)\n"
      "  /exit    leave (so does end of input)\n\n"
      "After each turn a line on stderr gives the tokens run in, tokens out and s/token\n"
      "(--quiet hides it and the memory plan). --history FILE saves the conversation after\n"
      "every turn (JSON: messages, every token id and the model's fingerprint; written to a\n"
      "temp file, fsynced and renamed) and, when FILE exists at start, resumes it by running\n"
      "the saved tokens through the model once; --system then applies only after a /reset. A\n"
      "history that is damaged or was saved with another model is refused (exit 2) and left\n"
      "as it is. --report-json FILE rewrites FILE after every turn with a JSON array of\n"
      "per-turn reports (the fields of k3 generate's, plus turn and position_before).\n"
      "--prompt-cache DIR keeps states on disk: the end of the --system prompt (every\n"
      "conversation with it starts from there) and the end of each turn (a resumed --history\n"
      "starts from its last turn instead of running it all again); the replies are the same.\n"
      "A reply also stops when the context (--max-context) is full; /reset then starts over.\n"
      "Ctrl-C stops a reply and returns to the prompt; Ctrl-C at the prompt exits 130.",
      kChat,
      RunChat};
  return kCommand;
}

}  // namespace k3::cli
