// k3 generate: text (or token ids) in, tokens streamed out as they are produced.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "apps/commands/commands.h"
#include "apps/commands/generate_batch.h"
#include "apps/options/engine_flags.h"
#include "apps/options/flags.h"
#include "apps/options/generate_options.h"
#include "apps/options/prompt_cache_flags.h"
#include "apps/reports/run_report.h"
#include "core/model/sampler.h"
#include "core/text/tokenizer/tokenizer.h"
#include "core/util/progress.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "pipeline/batch_scheduler.h"
#include "pipeline/engine.h"

namespace k3::cli {
namespace {

constexpr char kGenerateName[] = "generate";

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: '", std::string(piece), "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--ids: no token ids given");
  return ids;
}

struct Prompt {
  std::vector<int32_t> ids;
  std::optional<Tokenizer> tokenizer;  // to print text; absent with --ids and no tokenizer files
};

absl::StatusOr<Prompt> ReadPrompt(const std::string& model_dir) {
  const std::string text_flag = absl::GetFlag(FLAGS_prompt);
  const std::string file_flag = absl::GetFlag(FLAGS_prompt_file);
  const std::string ids_flag = absl::GetFlag(FLAGS_ids);
  const int given = !text_flag.empty() + !file_flag.empty() + !ids_flag.empty();
  if (given != 1) {
    return absl::InvalidArgumentError(given == 0
                                          ? "give the prompt with --prompt, --prompt-file or --ids"
                                          : "--prompt, --prompt-file and --ids exclude each other");
  }
  std::string text = text_flag;
  if (!file_flag.empty()) {
    auto contents = io::ReadFileToString(file_flag);
    if (!contents.ok()) return contents.status();
    text = *std::move(contents);
  }
  Prompt p;
  auto tokenizer = FindTokenizer(model_dir, /*required=*/ids_flag.empty());
  if (!tokenizer.ok()) return tokenizer.status();
  p.tokenizer = *std::move(tokenizer);
  if (!ids_flag.empty()) {
    auto ids = ParseIds(ids_flag);
    if (!ids.ok()) return ids.status();
    p.ids = *std::move(ids);
    return p;
  }
  p.ids = p.tokenizer->Encode(text, /*allow_special=*/true);  // as the official encode does
  if (p.ids.empty()) return absl::InvalidArgumentError("the prompt encodes to no tokens");
  return p;
}

// Prints a token as it is produced: its text (special tokens by name) when there is a
// tokenizer, else its id. The stop token itself is not printed.
void Emit(const Prompt& p, int32_t id, bool stop) {
  if (stop) return;
  absl::StatusOr<std::string> text = absl::InternalError("no tokenizer");
  if (p.tokenizer.has_value()) text = p.tokenizer->Decode({&id, 1});
  if (text.ok()) {
    std::fwrite(text->data(), 1, text->size(), stdout);
  } else {
    std::printf(" %d", id);
  }
  std::fflush(stdout);
}

// Generates up to n_predict tokens after the prompt through the batch scheduler (a batch of
// one: the loop `k3 serve` and --prompts run), streaming them; stops early at a stop id, at the
// context's end or on Ctrl-C. Returns the status of the first failed step.
absl::Status GenerateTokens(Engine& engine, const Prompt& prompt, const std::vector<int32_t>& stops,
                            int32_t n_predict, PromptCache* cache, RunReport& report) {
  auto sampler = ReadSampler();
  if (!sampler.ok()) return sampler.status();
  BatchRequest request;
  request.prompt = prompt.ids;
  request.max_tokens = n_predict;
  request.sampler = *sampler;
  request.stop_ids = stops;
  absl::Status dumped;
  BatchEvents events;
  if (cache != nullptr) report.SetPromptCache(UsePromptCache(*cache, request, events), *cache);
  // The prompt's tokens left to run, moving layer by layer: one chunk of a long prompt is
  // minutes on the full model.
  ProgressBar bar("prompt", request.prompt.size(), "tokens",
                  !absl::GetFlag(FLAGS_quiet) && StderrIsTerminal());
  size_t prompt_run = 0;
  events.on_prompt_progress = [&](size_t, size_t run, double) { bar.Update(prompt_run = run); };
  events.on_prompt_end = [&](size_t, std::span<const float> logits, const StepMetrics& steps) {
    bar.Finish();
    report.SetPrefill(prompt.ids, steps);
    if (const std::string path = absl::GetFlag(FLAGS_dump_logits); !path.empty()) {
      const std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
      dumped = io::WriteFileAtomically(path, bytes);
    }
  };
  events.on_token = [&](size_t, int32_t id, std::span<const float>, const StepMetrics& steps) {
    Emit(prompt, id, std::find(stops.begin(), stops.end(), id) != stops.end());
    report.AddStep({id, "", steps});
  };
  events.stop = [&] { return Interrupted() || !dumped.ok(); };
  auto result = RunSequence(engine, std::move(request), events);
  bar.Finish(prompt_run);  // where an interrupted or failed prompt stopped
  if (!dumped.ok()) return dumped;
  return result.status();
}

int RunGenerate(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kGenerateName, "unexpected argument " + positional[0]);
  if (const std::string prompts = absl::GetFlag(FLAGS_prompts); !prompts.empty()) {
    if (!absl::GetFlag(FLAGS_prompt).empty() || !absl::GetFlag(FLAGS_prompt_file).empty() ||
        !absl::GetFlag(FLAGS_ids).empty() || !absl::GetFlag(FLAGS_dump_logits).empty()) {
      return UsageError(kGenerateName,
                        "--prompts excludes --prompt, --prompt-file, --ids and --dump-logits");
    }
    auto options = EngineOptionsFromFlags();
    if (!options.ok()) return ReportError(kGenerateName, options.status());
    return RunGenerateBatch(*options, prompts);
  }
  if (!absl::GetFlag(FLAGS_out).empty()) {
    return UsageError(kGenerateName,
                      "--out is the results file of --prompts (one prompt's text goes "
                      "to stdout)");
  }
  const int32_t n_predict = absl::GetFlag(FLAGS_n_predict);
  if (n_predict < 0) return UsageError(kGenerateName, "--n-predict must be >= 0");
  if (auto s = ReadSampler(); !s.ok()) return ReportError(kGenerateName, s.status());
  auto options = EngineOptionsFromFlags();
  if (!options.ok()) return ReportError(kGenerateName, options.status());
  auto prompt = ReadPrompt(options->model_dir);
  if (!prompt.ok()) return ReportError(kGenerateName, prompt.status());
  auto engine = Engine::Open(*options);
  if (!engine.ok()) return ReportError(kGenerateName, engine.status());
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  if (!quiet) std::fprintf(stderr, "%s", PlanText(**engine).c_str());
  WarnAtStart(**engine);
  // The memory plan reserves sequence state for the context (--max-context, or what auto
  // chose); past it the latent cache would outgrow the budget.
  const int64_t context = (*engine)->max_context();
  if (static_cast<int64_t>(prompt->ids.size()) >= context) {
    return UsageError(kGenerateName, absl::StrCat("the prompt has ", prompt->ids.size(),
                                                  " tokens, the context holds ", context,
                                                  " (raise --max-context or --ram-gb)"));
  }
  // The scheduler ends the sequence where the context is full.
  const int32_t room = static_cast<int32_t>(context - static_cast<int64_t>(prompt->ids.size()));
  auto stops = StopIds((*engine)->config(), prompt->tokenizer);
  if (!stops.ok()) return ReportError(kGenerateName, stops.status());
  auto cache = PromptCacheFromFlags(**engine, "generate", 0);
  if (!cache.ok()) return ReportError(kGenerateName, cache.status());

  InstallInterruptHandler();
  RunReport report(!quiet);
  if (n_predict > room && !quiet) {
    std::fprintf(stderr, "k3 generate: --max-context %lld leaves room for %d of the %d tokens\n",
                 static_cast<long long>(context), room, n_predict);
  }
  const absl::Status status =
      GenerateTokens(**engine, *prompt, *stops, n_predict, cache->get(), report);
  std::printf("\n");
  std::fflush(stdout);
  if (!quiet) report.PrintSummary(**engine, Interrupted());
  if (const std::string path = absl::GetFlag(FLAGS_report_json); !path.empty()) {
    nlohmann::json json = report.ToJson(**engine);
    json["interrupted"] = Interrupted();
    if (!status.ok()) json["error"] = std::string(status.message());
    if (absl::Status s = io::WriteFileAtomically(path, json.dump(2) + "\n"); !s.ok()) {
      return ReportError(kGenerateName, s);
    }
  }
  if (!status.ok()) return ReportError(kGenerateName, status);
  return Interrupted() ? kExitInterrupted : kExitOk;
}
}  // namespace

const Subcommand& GenerateCommand() {
  static const Subcommand kCommand{
      kGenerateName,
      "generate text, streaming tokens as they are produced",
      "generate [--model DIR] (--prompt TEXT | --prompt-file FILE | --ids 1,2,3) [--n-predict "
      "N]\n"
      "            [--greedy | --temp X --top-p P --top-k K --seed S] [--stop-id ID ...]\n"
      "            [--ram-gb X | --preset NAME | --trunk-gb X --cache-gb X] [--trunk DIR]\n"
      "            [--queue-depth N] [--prefetch-distance D] [--threads N] [--no-overlap]\n"
      "            [--cache-policy NAME] [--storage-profile SPEC] [--report-json FILE]\n"
      "            [--prefill-chunk N|auto] [--prompt-cache DIR] [--prompt-cache-gb X]\n"
      "       generate --prompts FILE.jsonl [--batch B] [--bad-lines refuse|skip] [--out "
      "FILE]\n"
      "            [the sampler and memory flags above]",
      "Runs the model on a prompt and streams the generated text to stdout (token ids when the\n"
      "model has no tokenizer). Without --model it uses the built-in demo model, synthesised on\n"
      "first use into the cache directory ($XDG_CACHE_HOME/k3 or ~/.cache/k3). Greedy unless\n"
      "--temp is given.\n\n"
      "Routed experts stream from disk through an expert cache; the memory plan printed at the\n"
      "start shows how the RAM budget is split. On stderr: a row per token (seconds, cache hit\n"
      "rate, GB read, stall) and a summary; --report-json writes every figure. Ctrl-C stops,\n"
      "prints the summary and exits 130. Output is identical at every memory, I/O and thread\n"
      "setting.\n\n"
      "Long prompts: each layer runs --prefill-chunk prompt tokens at once (auto: as many as a\n"
      "quarter of the budget holds, said in the plan; with --trunk-gb/--cache-gb the split\n"
      "stays as given and the chunk's activations come on top of it, a quarter of the total),\n"
      "reading the streamed trunk and each expert they touch once per chunk. --prompt-cache\n"
      "DIR keeps the state of each prompt on disk (one token short of its end): a later prompt\n"
      "that repeats or extends it runs only the tokens after it, with the same tokens and\n"
      "logits.\n\n"
      "Many prompts: --prompts FILE takes JSON lines, one object per line with \"prompt\" or\n"
      "\"ids\" and optional \"id\", \"n_predict\", \"temperature\", \"top_k\", \"top_p\",\n"
      "\"seed\", \"greedy\", \"stop_ids\" (the flags give the defaults). Up to --batch\n"
      "sequences run at once (default: what the budget holds, at most 8), sharing every trunk\n"
      "read and expert read of a step; one that ends makes room for the next prompt, which\n"
      "is prefilled --prefill-chunk tokens a step alongside the others' decoding. Each\n"
      "sequence's tokens equal running it alone. The results go to stdout (or --out FILE)\n"
      "as JSON lines in input order (id, line, text, ids, finish_reason, timings), each as\n"
      "soon as the ones before it are done; a malformed line is named with its line number\n"
      "and refuses the run before anything is generated (--bad-lines skip leaves it out).\n"
      "Ctrl-C writes what has finished (live sequences as \"interrupted\") and exits 130. A\n"
      "--batch beyond what the budget holds exits 2 naming the maximum.",
      kGenerate,
      RunGenerate};
  return kCommand;
}

}  // namespace k3::cli
