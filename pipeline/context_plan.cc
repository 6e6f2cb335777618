#include "pipeline/context_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/util/progress.h"

namespace k3 {
namespace {

std::string Sequences(int n) { return absl::StrCat(n, n == 1 ? " sequence" : " sequences"); }

// Where the plan of `n` sequences at `tokens` of context stands against the rule: its state
// within the share, or the budget holding the whole model with it and the prompt chunks' share
// (so nothing else wants the room), or neither, or no plan at all.
enum class Fit { kShare, kWhole, kOverShare, kNoPlan };

bool Fits(Fit f) { return f == Fit::kShare || f == Fit::kWhole; }

struct Probe {
  const ModelFootprint& one;
  const MemoryRequest& request;
  uint64_t available;
  int n;

  Fit At(int64_t tokens, uint64_t* requested = nullptr) const {
    auto plan = PlanMemory(one.WithContext(tokens).WithSequences(n), request, available);
    if (!plan.ok()) return Fit::kNoPlan;
    if (requested != nullptr) *requested = plan->requested_bytes;
    const double grows = static_cast<double>(one.state_bytes_per_token) *
                         static_cast<double>(tokens) * static_cast<double>(n);
    if (grows <= kAutoContextShare * static_cast<double>(plan->requested_bytes)) return Fit::kShare;
    // The prompt chunks' share stays free: auto grows them after the context is chosen.
    const double rest = (1 - kAutoPrefillShare) * static_cast<double>(plan->budget_bytes);
    return rest >= static_cast<double>(plan->everything_bytes) ? Fit::kWhole : Fit::kOverShare;
  }
};

// The largest context that fits (0: none); `why` gets how it fits and `bound` what stops one
// more token (kShare: nothing, the limit stops it).
int64_t Largest(const Probe& probe, int64_t limit, Fit* why, Fit* bound) {
  *bound = Fit::kShare;
  if (Fits(*why = probe.At(limit))) return limit;
  if (!Fits(*why = probe.At(1))) {
    *bound = *why;
    return 0;
  }
  int64_t lo = 1, hi = limit;  // fits at lo, not at hi
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (Fits(probe.At(mid)) ? lo : hi) = mid;
  }
  *why = probe.At(lo);
  *bound = probe.At(hi);
  return lo;
}

bool GrowsWithWhatRuns(const ModelFootprint& one, const MemoryRequest& request,
                       uint64_t available) {
  uint64_t requested = 0;
  Probe{one, request, available, 1}.At(1, &requested);
  return requested == 0;
}

}  // namespace

int64_t AutoContext(const ModelFootprint& one, const MemoryRequest& request,
                    uint64_t available_ram_bytes, int64_t limit, int sequences) {
  Fit why, bound;
  return Largest(Probe{one, request, available_ram_bytes, sequences}, limit, &why, &bound);
}

ContextChoice ChooseContext(const ModelFootprint& one, const MemoryRequest& request,
                            uint64_t available_ram_bytes, int64_t limit, int least, int most) {
  ContextChoice c;
  const int64_t agent = std::min(kAgentContext, limit);
  if (GrowsWithWhatRuns(one, request, available_ram_bytes)) {
    c.sequences = most;
    if (request.preset == "ultra" && limit > kUltraContext) {
      c.context = kUltraContext;
      c.source =
          absl::StrCat("auto: ", kUltraContext, ", a chat's, the least memory (--preset ultra)");
      c.warning =
          absl::StrCat("k3: warning: --preset ultra plans a context of ", kUltraContext,
                       " tokens (an agent's prompts need ", agent, " or more); give --max-context ",
                       agent, " for more, at more memory");
      return c;
    }
    c.context = agent;
    c.source = absl::StrCat("auto: ", agent, agent < kAgentContext ? ", the model's limit" : "",
                            ", an agent's, with a budget that grows with what runs");
    return c;
  }
  Fit why = Fit::kShare, bound = Fit::kShare;
  for (c.sequences = most; c.sequences >= least; --c.sequences) {
    c.context = Largest(Probe{one, request, available_ram_bytes, c.sequences}, limit, &why, &bound);
    if (c.context >= agent || c.sequences == least) break;
  }
  const std::string who = Sequences(c.sequences);
  if (c.context == 0) return c;
  uint64_t requested = 0;
  Probe{one, request, available_ram_bytes, c.sequences}.At(1, &requested);
  if (c.context == limit) {
    c.source = absl::StrCat("auto, the model's limit (max_position_embeddings) for ", who);
  } else if (why == Fit::kWhole) {
    c.source = absl::StrCat("auto, the most the budget holds for ", who,
                            " beside the whole model and a quarter for the prompt chunks");
  } else if (bound == Fit::kOverShare) {
    c.source =
        absl::StrCat("auto, the most whose state of ",
                     FormatBytes(static_cast<double>(one.state_bytes_per_token)), " a token for ",
                     who, " takes a quarter of ", FormatBytes(static_cast<double>(requested)),
                     ", the rest kept for the trunk, the expert cache and the prompt chunks");
  } else {
    c.source = absl::StrCat("auto, the most the budget holds for ", who,
                            " beside the trunk's ring and the least expert cache");
  }
  if (c.context < agent) {
    c.warning = absl::StrCat("k3: warning: the memory budget holds a context of only ", c.context,
                             " tokens for ", who, " (an agent's prompts need ", agent,
                             " or more); raise --ram-gb or --preset",
                             c.sequences > 1 ? ", lower --batch" : "",
                             ", or give --max-context N to take it from the ", "expert cache");
  }
  return c;
}

}  // namespace k3
