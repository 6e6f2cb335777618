#include "apps/commands/generate_batch.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "apps/options/cli.h"
#include "apps/options/flags.h"
#include "apps/options/generate_options.h"
#include "apps/reports/device_report.h"
#include "apps/reports/run_report.h"
#include "core/util/median.h"
#include "core/util/progress.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "pipeline/batch_scheduler.h"

namespace k3::cli {
namespace {

constexpr char kName[] = "generate";
constexpr int kDefaultBatchCap = 8;

using json = nlohmann::json;

struct Item {
  int64_t line = 0;
  json id;  // echoed back; the line number when the line has none
  BatchRequest request;
};

struct BadLine {
  int64_t line = 0;
  std::string message;
};

// One line's request, on top of the defaults the flags give.
absl::StatusOr<Item> ParseLine(const json& j, int64_t line, const BatchRequest& defaults,
                               const std::optional<Tokenizer>& tokenizer, int64_t max_context) {
  if (j.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  static const char* kKeys[] = {"id",    "prompt", "ids",  "n_predict", "temperature",
                                "top_k", "top_p",  "seed", "greedy",    "stop_ids"};
  for (const auto& field : j.items()) {
    const std::string& key = field.key();
    if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) ==
        std::end(kKeys)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown field \"", key, "\""));
    }
  }
  Item item;
  item.line = line;
  item.id = j.contains("id") ? j["id"] : json(line);
  item.request = defaults;
  BatchRequest& r = item.request;
  auto ints = [&](const char* key, std::vector<int32_t>& out) -> absl::Status {
    if (!j[key].is_array())
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\": not a list"));
    out.clear();
    for (const json& v : j[key]) {
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", key, "\": ", v.dump(), " is not an integer"));
      }
      out.push_back(v.get<int32_t>());
    }
    return absl::OkStatus();
  };
  if (j.contains("prompt") == j.contains("ids")) {
    return absl::InvalidArgumentError("give exactly one of \"prompt\" and \"ids\"");
  }
  if (j.contains("ids")) {
    if (absl::Status s = ints("ids", r.prompt); !s.ok()) return s;
  } else {
    if (!j["prompt"].is_string()) return absl::InvalidArgumentError("\"prompt\": not a string");
    if (!tokenizer.has_value()) {
      return absl::InvalidArgumentError(
          "\"prompt\" needs a tokenizer (give \"ids\", or --tokenizer)");
    }
    r.prompt = tokenizer->Encode(j["prompt"].get<std::string>(), /*allow_special=*/true);
  }
  if (r.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (static_cast<int64_t>(r.prompt.size()) >= max_context) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", r.prompt.size(),
                                                   " tokens, --max-context is ", max_context));
  }
  if (j.contains("stop_ids")) {
    if (absl::Status s = ints("stop_ids", r.stop_ids); !s.ok()) return s;
  }
  try {
    if (j.contains("n_predict")) r.max_tokens = j["n_predict"].get<int32_t>();
    if (j.contains("temperature")) {
      r.sampler.temperature = j["temperature"].get<double>();
      r.sampler.greedy = r.sampler.temperature == 0;
    }
    if (j.contains("greedy")) r.sampler.greedy = j["greedy"].get<bool>();
    if (j.contains("top_k")) r.sampler.top_k = j["top_k"].get<int32_t>();
    if (j.contains("top_p")) r.sampler.top_p = j["top_p"].get<double>();
    if (j.contains("seed")) r.sampler.seed = j["seed"].get<uint64_t>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a field has the wrong type (", e.what(), ")"));
  }
  if (r.max_tokens < 0) return absl::InvalidArgumentError("\"n_predict\" must be >= 0");
  if (absl::Status s = ValidateSamplerOptions(r.sampler); !s.ok()) return s;
  return item;
}

// A line of the file that is not blank, parsed (discarded when it is not JSON).
struct Line {
  int64_t number = 0;
  json value;
};

// Every line of the file, read and parsed once.
absl::StatusOr<std::vector<Line>> ReadLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::vector<Line> lines;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    lines.push_back({number, json::parse(text, nullptr, /*allow_exceptions=*/false)});
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return lines;
}

// Whether the prompts need a tokenizer: a line with "prompt".
bool NeedsTokenizer(const std::vector<Line>& lines) {
  return std::any_of(lines.begin(), lines.end(), [](const Line& l) {
    return l.value.is_object() && l.value.contains("prompt");
  });
}

json ResultJson(const Item& item, const BatchResult& r, const std::optional<Tokenizer>& tok) {
  json out = {{"id", item.id},
              {"line", item.line},
              {"ids", r.ids},
              {"finish_reason", std::string(FinishReasonName(r.finish))},
              {"prompt_tokens", r.prompt_tokens},
              {"tokens", r.ids.size()},
              {"timings",
               {{"admitted_s", r.admitted_at},
                {"first_token_s", r.first_token_at},
                {"finished_s", r.finished_at},
                {"seconds_per_token", r.seconds_per_token()}}}};
  if (tok.has_value()) {  // the text without the stop id, as k3 generate prints it
    std::vector<int32_t> ids = r.ids;
    if (r.finish == FinishReason::kStop && !ids.empty()) ids.pop_back();
    auto text = tok->Decode(ids);
    out["text"] = text.ok() ? *text : std::string();
  }
  return out;
}

// The batch the flags ask for, or (0) what the budget holds: at most 8, and no more than the
// prompts. The engine plans it and refuses a --batch beyond what the budget holds.
absl::Status ChooseBatch(EngineOptions& options, size_t prompts) {
  const int asked = absl::GetFlag(FLAGS_batch);
  if (asked < 0) return absl::InvalidArgumentError("--batch must be >= 0");
  options.sequences = asked;
  options.max_sequences = static_cast<int>(std::min<size_t>(kDefaultBatchCap, prompts));
  return absl::OkStatus();
}

// The experts a layer multiplies per step, on average: the union of the live sequences'
// choices (top-k each), which is what a step reads when the cache misses.
double ExpertsPerLayerStep(const BatchTotals& t, const ModelConfig& c) {
  const int64_t moe_layers = c.num_layers - std::min(c.num_layers, c.first_k_dense_replace);
  return t.step_count > 0 && moe_layers > 0
             ? static_cast<double>(t.steps.cache_requests) / (t.step_count * moe_layers)
             : 0;
}

void PrintSummary(const BatchTotals& t, const std::vector<double>& per_token, int batch,
                  const ModelConfig& config) {
  const double tokens = static_cast<double>(std::max<int64_t>(1, t.sampled_tokens));
  const StepMetrics& m = t.steps;
  const double median = Median(per_token);
  std::fprintf(stderr,
               "%lld tokens in %.3f s: %.3f tokens/s over the batch (--batch %d, %lld steps, at "
               "most %d live); per sequence, median %.3f s/token\n",
               static_cast<long long>(t.sampled_tokens), t.seconds,
               t.seconds > 0 ? t.sampled_tokens / t.seconds : 0.0, batch,
               static_cast<long long>(t.step_count), t.max_live, median);
  std::fprintf(stderr,
               "read per emitted token: %s (experts: demand %s, prefetch used %s, wasted %s; "
               "trunk %s); disk busy %.0f%%, hit rate %.1f%%\n",
               FormatBytes((m.expert_demand_bytes + m.expert_prefetch_used_bytes +
                            m.expert_prefetch_wasted_bytes + m.trunk_bytes) /
                           tokens)
                   .c_str(),
               FormatBytes(m.expert_demand_bytes / tokens).c_str(),
               FormatBytes(m.expert_prefetch_used_bytes / tokens).c_str(),
               FormatBytes(m.expert_prefetch_wasted_bytes / tokens).c_str(),
               FormatBytes(m.trunk_bytes / tokens).c_str(),
               t.seconds > 0 ? 100 * m.disk_busy_seconds / t.seconds : 0.0, 100 * m.hit_rate());
  std::fprintf(
      stderr, "experts per layer and step: %.1f (the union of the live sequences' top-%lld)\n",
      ExpertsPerLayerStep(t, config), static_cast<long long>(config.num_experts_per_token));
}

json TotalsJson(const BatchTotals& t, const std::vector<double>& per_token, int batch,
                const Engine& engine) {
  return {{"batch", batch},
          {"experts_per_layer_step", ExpertsPerLayerStep(t, engine.config())},
          {"steps", t.step_count},
          {"max_live", t.max_live},
          {"sampled_tokens", t.sampled_tokens},
          {"decode_rows", t.decode_tokens},
          {"prefill_rows", t.prefill_tokens},
          {"seconds", t.seconds},
          {"tokens_per_second", t.seconds > 0 ? t.sampled_tokens / t.seconds : 0.0},
          {"seconds_per_token_per_sequence", per_token},
          {"metrics", t.steps.ToJson()},
          {"devices", DevicesJson(engine.devices(), t.seconds)},
          {"ranks", RanksJson(engine.ranks(), t.steps.tokens)},
          {"settings", engine.Settings()}};
}

}  // namespace

int RunGenerateBatch(EngineOptions options, const std::string& path) {
  const std::string mode = absl::GetFlag(FLAGS_bad_lines);
  if (mode != "refuse" && mode != "skip") {
    return UsageError(kName, "--bad-lines " + mode + ": expected refuse or skip");
  }
  auto sampler = ReadSampler();
  if (!sampler.ok()) return ReportError(kName, sampler.status());
  auto lines = ReadLines(path);
  if (!lines.ok()) return ReportError(kName, lines.status());
  auto tokenizer = FindTokenizer(options.model_dir, NeedsTokenizer(*lines));
  if (!tokenizer.ok()) return ReportError(kName, tokenizer.status());
  auto config = LoadModelConfig(options.model_dir + "/config.json");
  if (!config.ok()) return ReportError(kName, config.status());
  auto stops = StopIds(*config, *tokenizer);
  if (!stops.ok()) return ReportError(kName, stops.status());
  BatchRequest defaults;
  defaults.max_tokens = absl::GetFlag(FLAGS_n_predict);
  if (defaults.max_tokens < 0) return UsageError(kName, "--n-predict must be >= 0");
  defaults.sampler = *sampler;
  defaults.stop_ids = *stops;
  std::vector<Item> items;
  std::vector<BadLine> bad;
  for (const Line& line : *lines) {  // the requests, and the lines that are not one
    // Under auto the context is known once the engine is open: its scheduler refuses more.
    auto item = ParseLine(line.value, line.number, defaults, *tokenizer,
                          options.max_context == kAutoMaxContext ? INT64_MAX : options.max_context);
    if (item.ok()) {
      items.push_back(*std::move(item));
    } else {
      bad.push_back({line.number, std::string(item.status().message())});
    }
  }
  for (const BadLine& b : bad) {
    std::fprintf(stderr, "k3 generate: %s:%lld: %s%s\n", path.c_str(),
                 static_cast<long long>(b.line), b.message.c_str(),
                 mode == "skip" ? " (skipped)" : "");
  }
  if (!bad.empty() && mode == "refuse") {
    return UsageError(kName,
                      absl::StrCat(bad.size(), " malformed line(s) in ", path,
                                   ": nothing generated (--bad-lines skip leaves them out)"));
  }
  if (items.empty()) return UsageError(kName, absl::StrCat(path, ": no prompts"));
  if (auto s = ChooseBatch(options, items.size()); !s.ok()) return ReportError(kName, s);
  auto engine = Engine::Open(options);
  if (!engine.ok()) return ReportError(kName, engine.status());
  const int batch = (*engine)->sequences();
  const int holds = (*engine)->sequences_budget_holds();
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  if (!quiet) {
    std::fprintf(stderr, "%s", PlanText(**engine).c_str());
    std::fprintf(stderr, "batch: %d sequences at once, %zu prompts (the budget holds %s%d)\n",
                 batch, items.size(), holds == kMaxSequences ? "at least " : "", holds);
  }
  WarnAtStart(**engine);
  std::FILE* out = stdout;
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (!out_path.empty() && (out = std::fopen(out_path.c_str(), "w")) == nullptr) {
    return ReportError(kName, absl::NotFoundError(out_path + ": cannot be written"));
  }
  // Results leave in input order: each is written once every earlier one is.
  std::vector<std::optional<BatchResult>> results(items.size());
  std::vector<double> per_token;
  size_t written = 0, done = 0;
  std::optional<ProgressBar> bar;  // drawn once every prompt is queued
  auto write = [&](size_t i) {
    // A token may end inside a UTF-8 character: the text shows U+FFFD there (the ids are exact).
    const std::string line = ResultJson(items[i], *results[i], *tokenizer)
                                 .dump(-1, ' ', false, json::error_handler_t::replace) +
                             "\n";
    std::fwrite(line.data(), 1, line.size(), out);
    std::fflush(out);
  };
  BatchScheduler scheduler(**engine, {.batch = batch},
                           {.on_done =
                                [&](const BatchResult& r) {
                                  results[r.index] = r;
                                  if (r.ids.size() > 1) per_token.push_back(r.seconds_per_token());
                                  bar->Update(++done);
                                  for (; written < results.size() && results[written].has_value();
                                       ++written) {
                                    write(written);
                                  }
                                },
                            .stop = [] { return Interrupted(); }});
  for (Item& item : items) {
    if (auto s = scheduler.Add(item.request); !s.ok()) return ReportError(kName, s.status());
  }
  bar.emplace("sequences", items.size(), "", !quiet && StderrIsTerminal());
  InstallInterruptHandler();
  const absl::Status status = scheduler.Run();
  bar->Finish();
  // After an interrupt or an error: whatever finished behind a gap, still in input order.
  for (size_t i = written; i < results.size(); ++i) {
    if (results[i].has_value()) write(i);
  }
  if (out != stdout) std::fclose(out);
  if (!quiet) {
    PrintSummary(scheduler.totals(), per_token, batch, (*engine)->config());
    std::fputs(DevicesText((*engine)->devices(), scheduler.totals().seconds).c_str(), stderr);
    std::fputs(RanksText((*engine)->ranks(), scheduler.totals().steps.tokens).c_str(), stderr);
  }
  if (const std::string report = absl::GetFlag(FLAGS_report_json); !report.empty()) {
    json j = TotalsJson(scheduler.totals(), per_token, batch, **engine);
    j["interrupted"] = Interrupted();
    if (!status.ok()) j["error"] = std::string(status.message());
    if (absl::Status s = io::WriteFileAtomically(report, j.dump(2) + "\n"); !s.ok()) {
      return ReportError(kName, s);
    }
  }
  if (!status.ok()) return ReportError(kName, status);
  return Interrupted() ? kExitInterrupted : kExitOk;
}

}  // namespace k3::cli
