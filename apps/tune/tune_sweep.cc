#include "apps/tune/tune_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "apps/bench/decode_bench.h"
#include "core/util/median.h"
#include "core/util/progress.h"

namespace k3::cli::tune {
namespace {

using Clock = std::chrono::steady_clock;

// Runs cold engines, checks their tokens, keeps time against the budget.
class Runner {
 public:
  explicit Runner(const SweepOptions& o)
      : o_(o),
        start_(Clock::now()),
        bar_("tuning " + o.label, PlannedRuns(o), "runs", o.show_bar && !o.quiet) {}
  ~Runner() { bar_.Finish(); }

  // At most: the warm-up, every value of every dimension in every round, the confirmation.
  static uint64_t PlannedRuns(const SweepOptions& o) {
    uint64_t n = 1 + 2 * o.rounds;
    for (const Dimension& d : o.dimensions) n += d.values.size() * o.rounds;
    return n;
  }

  absl::StatusOr<double> Run(const EngineOptions& options, const std::string& what) {
    const auto t0 = Clock::now();
    auto run = bench::RunCold(options, o_.prompt, o_.tokens, nullptr, /*replay=*/false);
    if (!run.ok()) return run.status();
    run_seconds_.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (tokens_.empty()) tokens_ = run->ids;
    if (run->ids != tokens_) {
      return absl::InternalError(absl::StrCat(
          what, " decoded other tokens than the first run (", absl::StrJoin(run->ids, " "),
          " against ", absl::StrJoin(tokens_, " "), "): settings must never change the output"));
    }
    ++runs_;
    bar_.Update(runs_);
    if (!o_.quiet && !o_.show_bar) {
      std::fprintf(stderr, "k3 tune: %s[%d] %s: %s s/token\n", o_.label.c_str(), runs_,
                   what.c_str(), bench::Sig3(run->seconds_per_token).c_str());
    }
    return run->seconds_per_token;
  }

  // Whether `runs` more fit in the budget, at the median run time so far.
  bool Affordable(int runs) const {
    const double per_run = run_seconds_.empty() ? 0 : Median(run_seconds_);
    return Elapsed() + runs * per_run <= o_.budget_seconds;
  }
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  int runs() const { return runs_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  const SweepOptions& o_;
  Clock::time_point start_;
  std::vector<double> run_seconds_;
  std::vector<int32_t> tokens_;
  int runs_ = 0;
  ProgressBar bar_;
};

std::string Describe(const std::string& flag, int value) {
  return absl::StrCat("--", flag, " ", value);
}

// Sweeps one dimension from `best`, in `rounds` rounds, each over every value in an order
// rotated by one per round.
absl::Status SweepDimension(Runner& runner, const Dimension& dim, int rounds, EngineOptions& best,
                            DimensionResult& out) {
  out.rounds = rounds;
  for (int v : dim.values) out.trials.push_back({.value = v, .seconds_per_token = {}});
  const size_t n = out.trials.size();
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      Trial& t = out.trials[(k + round) % n];
      EngineOptions o = best;
      o.*dim.field = t.value;
      auto s = runner.Run(
          o, absl::StrCat(Describe(dim.flag, t.value), " (round ", round + 1, "/", rounds, ")"));
      if (!s.ok()) return s.status();
      t.seconds_per_token.push_back(*s);
    }
  }
  const auto median = [](const Trial& t) { return Median(t.seconds_per_token); };
  const Trial* current = nullptr;
  const Trial* fastest = &out.trials.front();
  for (const Trial& t : out.trials) {
    if (t.value == out.before) current = &t;
    if (median(t) < median(*fastest)) fastest = &t;
  }
  out.chosen = current != nullptr && median(*fastest) > (1 - kMargin) * median(*current)
                   ? out.before
                   : fastest->value;
  best.*dim.field = out.chosen;
  return absl::OkStatus();
}

bool SameSettings(const EngineOptions& a, const EngineOptions& b,
                  const std::vector<Dimension>& dims) {
  for (const Dimension& d : dims) {
    if (a.*d.field != b.*d.field) return false;
  }
  return true;
}

absl::Status Confirm(Runner& runner, const SweepOptions& o, SweepResult& r) {
  for (int pair = 0; pair < o.rounds; ++pair) {
    double d = 0, b = 0;
    for (int k = 0; k < 2; ++k) {  // defaults first in even pairs, the pick first in odd ones
      const bool defaults = (k == 0) == (pair % 2 == 0);
      auto s = runner.Run(defaults ? o.defaults : r.best,
                          absl::StrCat("confirming, ", defaults ? "defaults" : "pick", " (pair ",
                                       pair + 1, "/", o.rounds, ")"));
      if (!s.ok()) return s.status();
      (defaults ? d : b) = *s;
    }
    r.default_seconds.push_back(d);
    r.best_seconds.push_back(b);
    r.pair_ratios.push_back(d / b);
  }
  if (Median(r.pair_ratios) < 1) {
    r.pick_rejected = true;
    r.best = o.defaults;
  }
  return absl::OkStatus();
}

}  // namespace

int ValueOf(const EngineOptions& o, const std::vector<Dimension>& dims, const std::string& flag) {
  for (const Dimension& d : dims) {
    if (d.flag == flag) return o.*d.field;
  }
  return 0;
}

absl::StatusOr<SweepResult> Sweep(const SweepOptions& o) {
  Runner runner(o);
  SweepResult r;
  r.best = o.defaults;
  // A first run of the defaults: the reference tokens and the time a run takes.
  if (auto s = runner.Run(o.defaults, "defaults (warm-up)"); !s.ok()) return s.status();
  const int reserve = 2 * o.rounds;  // the confirmation
  for (const Dimension& dim : o.dimensions) {
    DimensionResult& out = r.dimensions.emplace_back();
    out.flag = dim.flag;
    out.before = out.chosen = r.best.*dim.field;
    if (!dim.fixed.empty() && !dim.values.empty()) {
      out.chosen = r.best.*dim.field = dim.values.front();
      out.fixed = dim.fixed;
      continue;
    }
    if (dim.flag == "prefetch-width" && r.best.prefetch_distance == 0) {
      out.skipped = "no lookahead was chosen (--prefetch-distance 0)";
      continue;
    }
    if (dim.values.size() < 2) {
      out.skipped = "one value only";
      continue;
    }
    int rounds = o.rounds;
    while (rounds > 1 &&
           !runner.Affordable(rounds * static_cast<int>(dim.values.size()) + reserve)) {
      --rounds;
    }
    if (!runner.Affordable(static_cast<int>(dim.values.size()) + reserve)) {
      out.skipped = "the time budget (--budget-s) ran out";
      continue;
    }
    if (absl::Status s = SweepDimension(runner, dim, rounds, r.best, out); !s.ok()) return s;
  }
  if (!SameSettings(r.best, o.defaults, o.dimensions)) {
    if (absl::Status s = Confirm(runner, o, r); !s.ok()) return s;
  }
  r.runs = runner.runs();
  r.elapsed_seconds = runner.Elapsed();
  r.tokens = runner.tokens();
  return r;
}

}  // namespace k3::cli::tune
