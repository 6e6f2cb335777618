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
#include "apps/chat/chat_history.h"
#include "apps/chat/chat_session.h"
#include "apps/commands/commands.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/options/generate_options.h"
#include "apps/options/prompt_cache_flags.h"
#include "apps/reports/run_report.h"
#include "apps/server/tool_request.h"
#include "core/model/sampler.h"
#include "core/text/chat_template.h"
#include "core/text/grammar/token_mask.h"
#include "core/text/tokenizer/tokenizer.h"
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

// Refuses a --history in a directory that does not exist now, rather than after the first
// reply, when the save would fail.
absl::Status CheckHistoryPath(const std::string& path) {
  if (path.empty() || io::FileExists(path)) return absl::OkStatus();
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  if (io::IsDirectory(parent.string())) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("--history ", path, ": directory ", parent.string(), " does not exist"));
}

// --tools FILE: OpenAI tool definitions, a list or an object with a "tools" list.
absl::Status ReadToolsFile(const std::string& path, ChatSettings& s) {
  if (path.empty()) return absl::OkStatus();
  auto text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto j = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("--tools " + path + ": not valid JSON");
  if (j.is_object() && j.contains("tools")) j = j["tools"];
  if (auto e = server::ReadTools(j, s.render, s.output)) {
    return absl::InvalidArgumentError(absl::StrCat("--tools ", path, ": ", e->message));
  }
  if (s.output.tools.empty()) return absl::InvalidArgumentError("--tools " + path + ": no tools");
  return absl::OkStatus();
}

// --tool-choice: auto, required, none or the name of a declared tool, as the API's tool_choice.
absl::Status ReadToolChoice(const std::string& choice, ChatSettings& s) {
  if (choice == "auto") return absl::OkStatus();
  if (s.output.tools.empty()) {
    return absl::InvalidArgumentError("--tool-choice " + choice + " needs --tools FILE");
  }
  s.render.tool_choice = choice;  // required and none render a tool-choice message
  if (choice == "required") {
    s.output.tool_choice = ToolChoice::kRequired;
  } else if (choice == "none") {
    s.output.tool_choice = ToolChoice::kNone;
  } else {
    const bool declared = std::any_of(s.output.tools.begin(), s.output.tools.end(),
                                      [&](const ToolSpec& t) { return t.name == choice; });
    if (!declared) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tool-choice ", choice, ": not auto, required, none or a tool of --tools"));
    }
    s.output.tool_choice = ToolChoice::kNamed;
    s.output.named_tool = choice;
  }
  return absl::OkStatus();
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
  if (absl::Status st = ReadToolsFile(absl::GetFlag(FLAGS_tools), s); !st.ok()) return st;
  if (absl::Status st = ReadToolChoice(absl::GetFlag(FLAGS_tool_choice), s); !st.ok()) return st;
  s.reasoning_budget = absl::GetFlag(FLAGS_reasoning_budget);
  if (s.reasoning_budget < -1) {
    return absl::InvalidArgumentError("--reasoning-budget must be -1 (no limit) or >= 0");
  }
  return s;
}

void PrintTurnStats(const TurnResult& t, const RunReport& report, int64_t turn) {
  const std::string cached =
      t.cached_tokens > 0 ? absl::StrCat(", ", t.cached_tokens, " from the prompt cache") : "";
  std::fprintf(stderr, "[turn %lld: %zu tokens in (%.3f s%s), %zu tokens out, %.4f s/token%s]\n",
               static_cast<long long>(turn), t.fed.size(), t.prefill_seconds, cached.c_str(),
               t.reply.size(), report.median_decode_seconds(),
               t.interrupted ? ", interrupted" : "");
}

// Runs one user message (or the results of the last reply's calls): streams the reply, then
// the stats line, the history and the report. A turn that would overflow the context is refused
// with a notice and the chat goes on.
int RunTurn(ChatSession& chat, const Engine& engine, const ChatSettings& s,
            const std::vector<std::string>& lines, bool tool_results, json& reports) {
  RunReport report(/*print_steps=*/false);
  TurnResult t;
  const absl::Status status =
      tool_results ? chat.ToolResults(lines, report, t) : chat.Turn(lines.front(), report, t);
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

// Asks for the result of each call of the last reply, a line each; false at the end of input.
LineReader::Result ReadToolResults(const ChatSession& chat, LineReader& reader, bool interactive,
                                   std::vector<std::string>& results) {
  results.clear();
  for (const ToolCall& call : chat.pending_calls()) {
    if (interactive) std::printf("result of %s> ", call.name.c_str());
    std::fflush(stdout);
    std::string line;
    const LineReader::Result r = reader.Next(line);
    if (r != LineReader::Result::kLine) return r;
    results.push_back(std::move(line));
  }
  return LineReader::Result::kLine;
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
  auto failed = [](LineReader::Result r) {
    if (r == LineReader::Result::kInterrupted) return kExitInterrupted;
    return ReportError(kChatName,
                       absl::InternalError(absl::StrCat("reading stdin: ", std::strerror(errno))));
  };
  for (;;) {
    if (interactive) std::printf("> ");
    std::fflush(stdout);
    const LineReader::Result r = reader.Next(line);
    if (r == LineReader::Result::kEof) return kExitOk;
    if (r != LineReader::Result::kLine) return failed(r);
    if (line == "/exit" || line == "/quit") return kExitOk;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    int rc = line == "/reset" ? ResetConversation(chat, s)
                              : RunTurn(chat, engine, s, {line}, /*tool_results=*/false, reports);
    // A reply that calls tools waits for their results, which go back to the model.
    std::vector<std::string> results;
    while (rc == kExitOk && !chat.pending_calls().empty()) {
      const LineReader::Result t = ReadToolResults(chat, reader, interactive, results);
      if (t == LineReader::Result::kEof) return kExitOk;
      if (t != LineReader::Result::kLine) return failed(t);
      rc = RunTurn(chat, engine, s, results, /*tool_results=*/true, reports);
    }
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
  if (!settings->output.tools.empty()) {
    auto trie = grammar::TokenTrie::Build(**tok);
    if (!trie.ok()) return ReportError(kChatName, trie.status());
    settings->trie = *std::move(trie);
  }
  ChatSession chat(**engine, **tok, *settings, *std::move(stops), cache->get());
  if (absl::Status s = chat.CheckTemplate(); !s.ok()) return ReportError(kChatName, s);
  if (!settings->quiet) std::fprintf(stderr, "%s", PlanText(**engine).c_str());
  WarnAtStart(**engine);
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
      "            [--prompt-cache DIR] [--tools FILE [--tool-choice C]]\n"
      "            [engine flags as for k3 generate]",
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
      "--tools FILE declares OpenAI tool definitions (a JSON list, or an object with a \"tools\"\n"
      "list): replies sample under the grammar of a tool call (arguments valid for their\n"
      "schemas); each call is printed as [call NAME ARGUMENTS] and the chat asks for its result\n"
      "(\"result of NAME> \", a line), which goes back to the model as a tool message.\n"
      "--tool-choice auto (default), required (every reply calls a tool, complete within\n"
      "--n-predict), none, or a tool's name (every reply calls that tool).\n"
      "--reasoning-budget N closes the think channel after N tokens and opens the response.\n"
      "A reply also stops when the context (--max-context) is full; /reset then starts over.\n"
      "Ctrl-C stops a reply and returns to the prompt; Ctrl-C at the prompt exits 130.",
      kChat,
      RunChat};
  return kCommand;
}

}  // namespace k3::cli
