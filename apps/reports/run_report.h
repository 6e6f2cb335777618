// What generate and chat tell the user about a run: the per-step table and the summary on
// stderr, the --report-json object, and Ctrl-C handling (stop cleanly, report, exit 130).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/options/prompt_cache_flags.h"
#include "nlohmann/json.hpp"
#include "pipeline/engine.h"

namespace k3::cli {

uint64_t PeakRssBytes();
uint64_t CurrentRssBytes();

// One generated token: step 0's figures are the prefill's (its first token comes from the
// prompt's logits).
struct StepRecord {
  int32_t id = 0;
  std::string text;  // as printed ("" without a tokenizer)
  StepMetrics metrics;
  uint64_t rss_bytes = 0;  // resident memory after the step (filled in by AddStep)
};

// Collects the steps of a run and prints them as they happen.
class RunReport {
 public:
  // print_steps: a table row per step on stderr, as each step ends when stdout is not a
  // terminal, else all rows after the text (so the streamed text is not interleaved).
  explicit RunReport(bool print_steps);
  void SetPrefill(const std::vector<int32_t>& prompt_ids, const StepMetrics& prefill);
  void AddStep(StepRecord step);  // prints its table row on stderr when print_steps
  // What the prompt cache did for the prompt (generate --prompt-cache).
  void SetPromptCache(const PromptCacheUse& use, const PromptCache& cache);
  // The summary lines on stderr: s/token, prefill time, bytes by kind, stall, hit rate, RSS.
  void PrintSummary(const Engine& engine, bool interrupted) const;  // with deferred rows first
  nlohmann::json ToJson(const Engine& engine) const;

  double median_decode_seconds() const;
  const std::vector<StepRecord>& steps() const { return steps_; }
  StepMetrics decode_totals() const;

 private:
  void PrintRow(size_t index) const;

  bool print_steps_;
  bool rows_at_end_;
  std::vector<int32_t> prompt_ids_;
  StepMetrics prefill_;
  std::vector<StepRecord> steps_;
  std::optional<PromptCacheUse> cache_use_;
  const PromptCache* cache_ = nullptr;
};

// The memory plan and how the checkpoint is read, as the commands print them before running.
std::string PlanText(const Engine& engine);
// Prints what the user should know at start whatever --quiet says: a context shorter than an
// agent needs (Engine::context_warning).
void WarnAtStart(const Engine& engine);

// SIGINT sets a flag (a second SIGINT kills at once, as usual) that the generation loops poll.
// The handler does not restart system calls, so that a read(2) waiting for input returns EINTR
// and its caller sees the flag.
void InstallInterruptHandler();
bool Interrupted();
// Whether SIGINT came, clearing it: `k3 chat` survives an interrupted reply and goes on.
bool TakeInterrupt();

}  // namespace k3::cli
