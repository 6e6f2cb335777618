// k3 generate: text (or token ids) in, tokens streamed out as they are produced.
#include <sys/resource.h>
#include <tbb/global_control.h>
#include <tbb/info.h>

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
#include "apps/commands.h"
#include "apps/flags.h"
#include "core/checkpoint.h"
#include "core/model/model.h"
#include "core/progress.h"
#include "core/sampler.h"
#include "core/synth.h"
#include "core/tokenizer/tokenizer.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, prompt, "", "Prompt text (encoded with the model's tokenizer).");
ABSL_FLAG(std::string, prompt_file, "", "Read the prompt text from this file.");
ABSL_FLAG(std::string, ids, "", "Prompt as raw token ids, e.g. 3,7,11 (no tokenizer needed).");
ABSL_FLAG(int32_t, n_predict, 32, "Tokens to generate (stops earlier at a stop id).");
ABSL_FLAG(bool, greedy, false, "Always take the most likely token (the default without --temp).");
ABSL_FLAG(double, temp, 0.0, "Sampling temperature; 0 means greedy.");
ABSL_FLAG(int32_t, top_k, 40, "Sample among the k most likely tokens (0 = all).");
ABSL_FLAG(double, top_p, 0.95, "Nucleus sampling: the smallest set with this much probability.");
ABSL_FLAG(std::vector<std::string>, stop_id, {},
          "Token id that ends generation (repeatable; default: [EOS] and <|end_of_msg|>).");
ABSL_FLAG(std::string, tokenizer, "",
          "Directory with tiktoken.model and tokenizer_config.json (default: the model's).");
ABSL_FLAG(std::string, dump_logits, "",
          "Write the logits at the last prompt position (raw little-endian float32, vocab_size "
          "values).");
ABSL_FLAG(std::string, report_json, "", "Write the run report (ids, timings, memory) as JSON.");
ABSL_FLAG(int32_t, threads, 0, "Compute threads (0 = one per core).");
ABSL_FLAG(int32_t, prefill_chunk, 64, "Prompt tokens processed together per layer.");

namespace k3::cli {
namespace {

constexpr char kName[] = "generate";

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

uint64_t PeakRssBytes() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// The built-in demo checkpoint, synthesised once into the user's cache directory.
absl::StatusOr<std::string> DemoModelDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg != nullptr && *xdg != '\0' ? xdg
                     : home != nullptr              ? std::string(home) + "/.cache"
                                                    : "/tmp";
  const std::string dir = base + "/k3/demo-model";
  if (io::FileExists(dir + "/config.json")) return dir;
  std::fprintf(stderr, "k3: synthesising the built-in demo model into %s (once)\n", dir.c_str());
  SynthOptions opt;
  opt.preset = "demo";
  opt.out_dir = dir;
  opt.router_skew = 1.0;
  opt.show_progress = ShowProgress();
  auto r = Synthesize(opt);
  if (!r.ok()) return r.status();
  return dir;
}

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
  std::string tok_dir = absl::GetFlag(FLAGS_tokenizer);
  if (tok_dir.empty()) tok_dir = model_dir;
  if (io::FileExists(tok_dir + "/tiktoken.model")) {
    auto tok = Tokenizer::Load(tok_dir);
    if (!tok.ok()) return tok.status();
    p.tokenizer = *std::move(tok);
  } else if (!absl::GetFlag(FLAGS_tokenizer).empty() || ids_flag.empty()) {
    return absl::NotFoundError(absl::StrCat("no tokenizer: ", tok_dir,
                                            "/tiktoken.model does not exist (use --ids, or "
                                            "--tokenizer DIR)"));
  }
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

absl::StatusOr<std::vector<int32_t>> StopIds(const ModelConfig& c, const Prompt& p) {
  std::vector<int32_t> stops;
  for (const std::string& s : absl::GetFlag(FLAGS_stop_id)) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(s, &id) || id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stop-id ", s, ": not a token id below ", c.vocab_size));
    }
    stops.push_back(id);
  }
  if (!absl::GetFlag(FLAGS_stop_id).empty()) return stops;
  // Default (MODEL.md 0 Q12): [EOS] and <|end_of_msg|>, by name when the tokenizer has them.
  for (const char* name : {"[EOS]", "<|end_of_msg|>"}) {
    if (p.tokenizer.has_value()) {
      if (auto id = p.tokenizer->SpecialTokenId(name); id && *id < c.vocab_size)
        stops.push_back(*id);
    }
  }
  if (stops.empty()) {
    for (int32_t id : {163585, 163586}) {
      if (id < c.vocab_size) stops.push_back(id);
    }
  }
  return stops;
}

absl::StatusOr<SamplerOptions> ReadSampler() {
  SamplerOptions s;
  s.temperature = absl::GetFlag(FLAGS_temp);
  s.greedy = absl::GetFlag(FLAGS_greedy) || s.temperature == 0;
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.top_p = absl::GetFlag(FLAGS_top_p);
  s.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_greedy) && s.temperature != 0) {
    return absl::InvalidArgumentError("--greedy and --temp exclude each other");
  }
  if (absl::Status st = ValidateSamplerOptions(s); !st.ok()) return st;
  return s;
}

struct StepRecord {
  int32_t id;
  double seconds;
};

void WriteReport(const std::string& path, const Prompt& prompt,
                 const std::vector<StepRecord>& steps, double prefill_seconds, uint64_t trunk_bytes,
                 const SamplerOptions& sampler, int threads) {
  std::vector<int32_t> generated;
  std::vector<double> decode;
  nlohmann::json per_token = nlohmann::json::array();
  for (size_t i = 0; i < steps.size(); ++i) {
    generated.push_back(steps[i].id);
    per_token.push_back({{"step", i}, {"id", steps[i].id}, {"seconds", steps[i].seconds}});
    if (i > 0) decode.push_back(steps[i].seconds);  // step 0's time is the prefill
  }
  double median = 0;
  if (!decode.empty()) {
    std::sort(decode.begin(), decode.end());
    median = decode[decode.size() / 2];
  }
  nlohmann::json report = {
      {"prompt_ids", prompt.ids},
      {"generated_ids", generated},
      {"seconds_per_token", median},
      {"prefill_seconds", prefill_seconds},
      {"peak_rss_bytes", PeakRssBytes()},
      {"bytes_read", {{"trunk", trunk_bytes}}},
      {"settings",
       {{"threads", threads},
        {"prefill_chunk", absl::GetFlag(FLAGS_prefill_chunk)},
        {"greedy", sampler.greedy},
        {"temperature", sampler.temperature},
        {"top_k", sampler.top_k},
        {"top_p", sampler.top_p},
        {"seed", sampler.seed},
        {"expert_source", "checkpoint (synchronous reads)"}}},
      {"per_token", per_token},
  };
  if (absl::Status s = io::WriteFileAtomically(path, report.dump(2) + "\n"); !s.ok()) {
    std::fprintf(stderr, "k3 generate: %s\n", std::string(s.message()).c_str());
  }
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

int RunGenerate(const std::vector<std::string>& positional) {
  if (!positional.empty()) return UsageError(kName, "unexpected argument " + positional[0]);
  const int32_t n_predict = absl::GetFlag(FLAGS_n_predict);
  const int32_t chunk = absl::GetFlag(FLAGS_prefill_chunk);
  const int32_t threads_flag = absl::GetFlag(FLAGS_threads);
  if (n_predict < 0) return UsageError(kName, "--n-predict must be >= 0");
  if (chunk < 1) return UsageError(kName, "--prefill-chunk must be >= 1");
  if (threads_flag < 0) return UsageError(kName, "--threads must be >= 0");
  auto sampler_options = ReadSampler();
  if (!sampler_options.ok()) return ReportError(kName, sampler_options.status());

  std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    auto demo = DemoModelDir();
    if (!demo.ok()) return ReportError(kName, demo.status());
    dir = *demo;
  }
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ReportError(kName, ckpt.status());
  const ModelConfig& config = (*ckpt)->config();
  auto prompt = ReadPrompt(dir);
  if (!prompt.ok()) return ReportError(kName, prompt.status());
  auto stops = StopIds(config, *prompt);
  if (!stops.ok()) return ReportError(kName, stops.status());

  const int threads = threads_flag > 0 ? threads_flag : tbb::info::default_concurrency();
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
  // One bar for the whole load (made on the first report, when the total is known); small
  // trunks load too fast to need one.
  std::optional<ProgressBar> bar;
  auto trunk = LoadTrunkWeights(**ckpt, [&](uint64_t done, uint64_t total) {
    if (!bar) bar.emplace("loading trunk", total, "B", ShowProgress() && total > (256u << 20));
    bar->Update(done);
  });
  if (bar) bar->Finish();
  if (!trunk.ok()) return ReportError(kName, trunk.status());
  CheckpointExpertProvider provider(**ckpt);
  Model model(config, **trunk, provider);
  SequenceState state(config);
  Sampler sampler(*sampler_options);

  // Prefill in chunks; the last chunk's logits choose the first token.
  const auto t0 = Clock::now();
  std::vector<float> logits;
  const std::vector<int32_t>& ids = prompt->ids;
  for (size_t at = 0; at < ids.size(); at += chunk) {
    const size_t n = std::min<size_t>(chunk, ids.size() - at);
    if (absl::Status s = model.Forward({ids.data() + at, n}, state, false, logits); !s.ok()) {
      return ReportError(kName, s);
    }
  }
  const double prefill_seconds = Seconds(t0, Clock::now());
  if (const std::string path = absl::GetFlag(FLAGS_dump_logits); !path.empty()) {
    std::string bytes(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
    if (absl::Status s = io::WriteFileAtomically(path, bytes); !s.ok())
      return ReportError(kName, s);
  }
  std::vector<StepRecord> steps;
  auto step_start = t0;
  for (int32_t i = 0; i < n_predict; ++i) {
    const int32_t id = sampler.Sample(logits);
    const bool stop = std::find(stops->begin(), stops->end(), id) != stops->end();
    Emit(*prompt, id, stop);
    steps.push_back({id, Seconds(step_start, Clock::now())});
    if (stop || i + 1 == n_predict) break;
    step_start = Clock::now();
    if (absl::Status s = model.Forward({&id, 1}, state, false, logits); !s.ok()) {
      std::printf("\n");
      return ReportError(kName, s);
    }
  }
  std::printf("\n");
  const double total = Seconds(t0, Clock::now());
  if (!absl::GetFlag(FLAGS_quiet)) {
    std::fprintf(stderr,
                 "k3 generate: %zu prompt tokens in %.3f s, %zu generated in %.3f s "
                 "(%.2f tok/s), peak RSS %s\n",
                 ids.size(), prefill_seconds, steps.size(), total - prefill_seconds,
                 steps.size() > 1 ? (steps.size() - 1) / (total - prefill_seconds) : 0.0,
                 FormatBytes(static_cast<double>(PeakRssBytes())).c_str());
  }
  if (const std::string path = absl::GetFlag(FLAGS_report_json); !path.empty()) {
    WriteReport(path, *prompt, steps, prefill_seconds, (*trunk)->bytes, *sampler_options, threads);
  }
  return kExitOk;
}

}  // namespace

const Subcommand& GenerateCommand() {
  static const Subcommand kCommand = {
      kName,
      "generate text, streaming tokens as they are produced",
      "generate [--model DIR] (--prompt TEXT | --prompt-file FILE | --ids 1,2,3) [--n-predict N]\n"
      "            [--greedy | --temp X --top-p P --top-k K --seed S] [--stop-id ID ...]",
      "Runs the model on a prompt and streams the generated text to stdout (token ids when the\n"
      "model has no tokenizer). Without --model it uses the built-in demo model, synthesised on\n"
      "first use into the cache directory ($XDG_CACHE_HOME/k3 or ~/.cache/k3). Greedy unless\n"
      "--temp is given. A summary goes to stderr; --report-json writes ids, timings and peak RSS.",
      {"model", "prompt", "prompt-file", "ids", "n-predict", "greedy", "temp", "top-k", "top-p",
       "seed", "stop-id", "tokenizer", "dump-logits", "report-json", "threads", "prefill-chunk",
       "quiet"},
      RunGenerate};
  return kCommand;
}

}  // namespace k3::cli
