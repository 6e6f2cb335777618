#include "pipeline/run_plan.h"

#include <algorithm>
#include <optional>

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

namespace {

// The refusal of more sequences than the budget holds, naming the most it holds. With the
// automatic context the context is already the least (one token), so a smaller one is no way out.
absl::Status TooManySequences(const RunRequest& r, bool auto_context, int asked, int fits,
                              uint64_t state_bytes) {
  const bool batch = r.sequences_source.empty();
  return absl::InvalidArgumentError(absl::StrCat(
      batch ? absl::StrCat("--batch ", asked) : r.sequences_source, ": the budget holds at most ",
      fits, fits == 1 ? " sequence" : " sequences", " (each needs ",
      FormatBytes(static_cast<double>(state_bytes)), " of state at ",
      auto_context ? "the least context, 1 token" : absl::StrCat("--max-context ", r.max_context),
      "); use ", batch ? absl::StrCat("--batch ", fits) : "fewer",
      auto_context ? " or a larger budget" : ", a larger budget or a smaller --max-context"));
}

// `--prefill-chunk auto` over `plan`, made for `small`'s chunks at `context` tokens: a whole
// prompt in one chunk reads the streamed trunk and each expert it touches once per layer, where
// small chunks read them once per chunk. `ram`: the RAM available (0: unknown).
void GrowPrefillChunk(const Checkpoint& ckpt, const RunRequest& r, int64_t context,
                      const ModelFootprint& small, uint64_t ram, MemoryPlan& plan) {
  const MemoryRequest& m = r.memory;
  if (m.preset == "ultra") {  // the least memory: the small chunks
    plan.prefill_chunk_source =
        absl::StrCat("auto: ", small.prefill_chunk, ", the least memory (--preset ultra)");
    return;
  }
  const uint64_t per_token = std::max<uint64_t>(1, small.prefill_bytes_per_token);
  // --ram-gb and the presets: the activations take a quarter of the budget from the trunk and
  // the cache. An explicit split stays what it says: the activations come on top of it, like the
  // other fixed parts, and take a quarter of the total they make (a third of the rest), so the
  // split plans the chunk --ram-gb of that total plans; and no more than the RAM available holds
  // beside the rest.
  const bool split = m.trunk_gb > 0 || m.cache_gb > 0;
  const uint64_t rest = plan.budget_bytes - per_token * static_cast<uint64_t>(small.prefill_chunk);
  auto share = static_cast<uint64_t>(
      split ? kAutoPrefillShare / (1 - kAutoPrefillShare) * static_cast<double>(rest)
            : kAutoPrefillShare * static_cast<double>(plan.budget_bytes));
  bool by_ram = false;
  if (split && ram > 0) {
    const uint64_t room =
        ram > rest + kProcessOverheadBytes ? ram - rest - kProcessOverheadBytes : 0;
    by_ram = room < share;
    share = std::min(share, room);
  }
  const std::string activations =
      absl::StrCat("activations of ", FormatBytes(static_cast<double>(per_token)), " a token");
  const int64_t cap = std::min(kMaxAutoPrefillChunk, context);
  const int64_t most = std::clamp<int64_t>(static_cast<int64_t>(share / per_token), 1, cap);
  for (int64_t chunk = most; chunk > small.prefill_chunk; chunk /= 2) {
    const ModelFootprint f =
        MeasureFootprint(ckpt, context, chunk, r.ring).WithSequences(small.sequences);
    auto planned = PlanMemory(f, m, ram);
    if (!planned.ok()) continue;
    const uint64_t minimum = plan.minimum_bytes;  // the smallest budget runs small chunks
    plan = *std::move(planned);
    plan.minimum_bytes = minimum;
    const std::string on_top =
        split ? absl::StrCat(
                    "; its ",
                    FormatBytes(static_cast<double>(per_token * static_cast<uint64_t>(chunk))),
                    " of activations come on top of the --trunk-gb/--cache-gb split")
              : "";
    if (chunk < most) {
      plan.prefill_chunk_source = absl::StrCat("auto, halved from ", most, " until the plan fits (",
                                               activations, ")", on_top);
    } else if (most == cap) {
      plan.prefill_chunk_source =
          absl::StrCat("auto, capped at ", cap == context ? "--max-context " : "", cap, on_top);
    } else if (by_ram) {
      plan.prefill_chunk_source = absl::StrCat("auto, the most whose ", activations, " fit in the ",
                                               FormatBytes(static_cast<double>(ram)),
                                               " available beside the rest of the plan", on_top);
    } else {
      plan.prefill_chunk_source = absl::StrCat("auto, the most whose ", activations,
                                               " take a quarter of the budget", on_top);
    }
    return;
  }
  plan.prefill_chunk_source =
      by_ram ? absl::StrCat("auto: ", small.prefill_chunk, ", the ",
                            FormatBytes(static_cast<double>(ram)),
                            " available hold no more beside the --trunk-gb/--cache-gb split")
             : absl::StrCat("auto: no more than ", small.prefill_chunk,
                            " tokens' activations fit beside the model");
}

}  // namespace

absl::StatusOr<RunPlan> PlanRun(const Checkpoint& ckpt, const RunRequest& r, uint64_t ram) {
  const bool auto_chunk = r.prefill_chunk == kAutoPrefillChunk;
  const bool auto_context = r.max_context == kAutoMaxContext;
  ModelFootprint one = MeasureFootprint(ckpt, auto_context ? 1 : r.max_context,
                                        auto_chunk ? kSmallPrefillChunk : r.prefill_chunk, r.ring);
  const int least = r.sequences > 0 ? r.sequences : r.min_sequences;
  if (r.sequences < 0 || least < 1) return absl::InvalidArgumentError("--batch must be >= 1");
  RunPlan run;
  int64_t context = r.max_context;
  std::optional<ContextChoice> chosen;
  if (auto_context) {
    chosen = ChooseContext(one, r.memory, ram, ckpt.config().max_position_embeddings, least,
                           r.sequences > 0 ? least : r.max_sequences);
    context = std::max<int64_t>(1, chosen->context);
    one = one.WithContext(context);
    run.context_warning = chosen->warning;
  }
  run.sequences_budget_holds = MaxSequences(one, r.memory, ram, kMaxSequences);
  const int n = r.sequences > 0 ? r.sequences
                : chosen        ? chosen->sequences
                         : std::max(least, std::min(run.sequences_budget_holds, r.max_sequences));
  const ModelFootprint footprint = one.WithSequences(n);
  auto planned = PlanMemory(footprint, r.memory, ram);
  if (!planned.ok() && n > 1) {
    if (const int fits = MaxSequences(one, r.memory, ram, n); fits >= 1) {
      return TooManySequences(r, auto_context, least, fits, one.state_bytes_per_sequence);
    }
  }
  if (!planned.ok()) return planned.status();
  run.memory = *std::move(planned);
  if (auto_chunk) GrowPrefillChunk(ckpt, r, context, footprint, ram, run.memory);
  if (chosen && chosen->context > 0) run.memory.context_source = chosen->source;
  run.expert_slot_bytes = footprint.expert_slot_bytes;
  return run;
}

absl::StatusOr<RunPlan> PlanExpertRank(const Checkpoint& ckpt, const RunRequest& request,
                                       uint64_t ram) {
  auto run = PlanRun(ckpt, request, ram);
  if (!run.ok()) return run.status();
  MemoryPlan& plan = run->memory;
  const ModelConfig& c = ckpt.config();
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe_layers += c.is_dense(l) ? 0 : 1;
  const uint64_t slot = run->expert_slot_bytes;
  const uint64_t reserved = plan.buffer_bytes + plan.vector_bytes;
  const uint64_t room = plan.budget_bytes > reserved ? plan.budget_bytes - reserved : 0;
  plan.cache_slots =
      std::min<int64_t>(std::max<int64_t>(plan.cache_slots, static_cast<int64_t>(room / slot)),
                        moe_layers * static_cast<int64_t>(c.num_experts));
  plan.cache_bytes = static_cast<uint64_t>(plan.cache_slots) * slot;
  return run;
}

}  // namespace k3
