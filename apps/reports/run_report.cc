#include "apps/reports/run_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_format.h"
#include "apps/options/cli.h"
#include "apps/reports/device_report.h"
#include "core/util/median.h"
#include "core/util/progress.h"
#include "pipeline/memory_plan_json.h"

namespace k3::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnSigint(int) {
  if (g_interrupted.exchange(true)) std::_Exit(kExitInterrupted);
}

double Gb(uint64_t bytes) { return static_cast<double>(bytes) / 1e9; }

uint64_t ExpertBytes(const StepMetrics& m) {
  return m.expert_demand_bytes + m.expert_prefetch_used_bytes + m.expert_prefetch_wasted_bytes;
}

uint64_t AllBytes(const StepMetrics& m) { return ExpertBytes(m) + m.trunk_bytes; }

}  // namespace

uint64_t PeakRssBytes() {
  struct rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

uint64_t CurrentRssBytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * 4096;
}

void InstallInterruptHandler() {
  struct sigaction sa = {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  sigaction(SIGINT, &sa, nullptr);
}

bool Interrupted() { return g_interrupted.load(); }

bool TakeInterrupt() { return g_interrupted.exchange(false); }

void RunReport::SetPrefill(const std::vector<int32_t>& prompt_ids, const StepMetrics& prefill) {
  prompt_ids_ = prompt_ids;
  prefill_ = prefill;
}

RunReport::RunReport(bool print_steps)
    : print_steps_(print_steps), rows_at_end_(::isatty(STDOUT_FILENO) != 0) {}

void RunReport::PrintRow(size_t index) const {
  if (index == 0) {
    std::fprintf(stderr, "\n%5s %8s %9s %6s %8s %8s %8s\n", "step", "token", "seconds", "hit%",
                 "GB read", "stall s", "tok/s");
  }
  const StepMetrics& m = steps_[index].metrics;
  std::fprintf(stderr, "%5zu %8d %9.3f %6.1f %8.3f %8.3f %8.2f\n", index, steps_[index].id,
               m.seconds, 100 * m.hit_rate(), Gb(AllBytes(m)), m.io_wait_seconds,
               m.seconds > 0 ? 1 / m.seconds : 0.0);
}

void RunReport::AddStep(StepRecord step) {
  step.rss_bytes = CurrentRssBytes();
  steps_.push_back(std::move(step));
  if (print_steps_ && !rows_at_end_) PrintRow(steps_.size() - 1);
}

StepMetrics RunReport::decode_totals() const {
  StepMetrics total;
  for (size_t i = 1; i < steps_.size(); ++i) total.Add(steps_[i].metrics);
  return total;
}

double RunReport::median_decode_seconds() const {
  std::vector<double> s;
  for (size_t i = 1; i < steps_.size(); ++i) s.push_back(steps_[i].metrics.seconds);
  return Median(std::move(s));
}

void RunReport::SetPromptCache(const PromptCacheUse& use, const PromptCache& cache) {
  cache_use_ = use;
  cache_ = &cache;
}

void RunReport::PrintSummary(const Engine& engine, bool interrupted) const {
  if (print_steps_ && rows_at_end_) {
    for (size_t i = 0; i < steps_.size(); ++i) PrintRow(i);
  }
  const StepMetrics d = decode_totals();
  const size_t decoded = steps_.empty() ? 0 : steps_.size() - 1;
  std::fprintf(stderr,
               "\n%s%zu prompt tokens in %.3f s; %zu decode steps, median %.3f s/token "
               "(%.2f tok/s)\n",
               interrupted ? "interrupted: " : "", prompt_ids_.size(), prefill_.seconds, decoded,
               median_decode_seconds(),
               d.seconds > 0 ? static_cast<double>(decoded) / d.seconds : 0.0);
  std::fprintf(stderr,
               "decode: read %.3f GB/token (experts: demand %.3f, prefetch used %.3f, wasted "
               "%.3f; trunk %.3f GB), stall %.3f s (trunk %.3f) of %.3f s, disk busy %.0f%%, "
               "hit rate "
               "%.1f%%, prefetch precision %.2f recall %.2f\n",
               decoded ? Gb(AllBytes(d)) / decoded : 0.0, Gb(d.expert_demand_bytes),
               Gb(d.expert_prefetch_used_bytes), Gb(d.expert_prefetch_wasted_bytes),
               Gb(d.trunk_bytes), d.io_wait_seconds, d.trunk_wait_seconds, d.seconds,
               d.seconds > 0 ? 100 * d.disk_busy_seconds / d.seconds : 0.0, 100 * d.hit_rate(),
               d.prefetch_precision(), d.prefetch_recall());
  if (const uint64_t pieces = d.trunk_pieces_decoded_fused + d.trunk_pieces_decoded_whole) {
    std::fprintf(
        stderr,
        "compressed trunk: %llu pieces decoded in %.3f s of thread time, %.0f%% in the "
        "products as they multiply, the rest whole\n",
        static_cast<unsigned long long>(pieces), d.trunk_decode_seconds,
        100.0 * static_cast<double>(d.trunk_pieces_decoded_fused) / static_cast<double>(pieces));
  }
  for (const PrefetchAccuracy& a : engine.prefetch_accuracy()) {
    std::fprintf(stderr, "lookahead distance %d: precision %.2f, recall %.2f (%llu predicted)\n",
                 a.distance, a.precision(), a.recall(),
                 static_cast<unsigned long long>(a.predicted));
  }
  std::fprintf(stderr,
               "prefill: %.3f s, %llu experts read, %.3f GB; peak RSS %s (budget %s, plus %s for "
               "the process itself)\n",
               prefill_.seconds, static_cast<unsigned long long>(prefill_.experts_demand_read),
               Gb(AllBytes(prefill_)), FormatBytes(static_cast<double>(PeakRssBytes())).c_str(),
               FormatBytes(static_cast<double>(engine.plan().budget_bytes)).c_str(),
               FormatBytes(static_cast<double>(kProcessOverheadBytes)).c_str());
  std::fputs(DevicesText(engine.devices(), prefill_.seconds + d.seconds).c_str(), stderr);
  std::fputs(RanksText(engine.ranks(), prefill_.tokens + d.tokens).c_str(), stderr);
  if (cache_use_) {
    std::fprintf(stderr, "prompt cache: %lld of %zu prompt tokens resumed in %.3f s from %s\n",
                 static_cast<long long>(cache_use_->cached_tokens), prompt_ids_.size(),
                 cache_use_->load_seconds, cache_->directory().c_str());
  }
}

nlohmann::json RunReport::ToJson(const Engine& engine) const {
  std::vector<int32_t> generated;
  nlohmann::json per_token = nlohmann::json::array();
  for (size_t i = 0; i < steps_.size(); ++i) {
    generated.push_back(steps_[i].id);
    nlohmann::json t = steps_[i].metrics.ToJson();
    t["step"] = i;
    t["id"] = steps_[i].id;
    t["rss_bytes"] = steps_[i].rss_bytes;
    per_token.push_back(std::move(t));
  }
  const StepMetrics d = decode_totals();
  nlohmann::json report = d.ToJson();  // decode totals: bytes_read, cache, prefetch, ...
  report["prompt_ids"] = prompt_ids_;
  report["generated_ids"] = generated;
  report["seconds_per_token"] = median_decode_seconds();
  report["prefill_seconds"] = prefill_.seconds;
  report["prefill"] = prefill_.ToJson();
  // What a user waits for: reading a cached state, then running the rest of the prompt.
  report["time_to_first_token_seconds"] =
      prefill_.seconds + (cache_use_ ? cache_use_->load_seconds : 0.0);
  if (cache_use_) report["prompt_cache"] = cache_use_->ToJson(*cache_);
  report["peak_rss_bytes"] = PeakRssBytes();
  report["settings"] = engine.Settings();
  report["memory_plan"] = MemoryPlanJson(engine.plan());
  nlohmann::json by_distance = nlohmann::json::array();
  for (const PrefetchAccuracy& a : engine.prefetch_accuracy()) {
    by_distance.push_back({{"distance", a.distance},
                           {"predicted", a.predicted},
                           {"correct", a.correct},
                           {"precision", a.precision()},
                           {"recall", a.recall()}});
  }
  report["prefetch"]["by_distance"] = by_distance;
  report["devices"] = DevicesJson(engine.devices(), prefill_.seconds + d.seconds);
  report["ranks"] = RanksJson(engine.ranks(), prefill_.tokens + d.tokens);
  report["per_token"] = per_token;
  return report;
}

std::string PlanText(const Engine& engine) {
  return engine.plan().Describe() + engine.DescribeReads();
}

void WarnAtStart(const Engine& engine) {
  if (!engine.context_warning().empty()) {
    std::fprintf(stderr, "%s\n", engine.context_warning().c_str());
  }
}

}  // namespace k3::cli
