// The plan of a run: the context a sequence gets, the sequences planned at once and the prompt
// chunk, chosen from the memory budget in one place (PlanRun), with the reasons the plan prints.
// The engine builds what the plan says and changes none of the options it was given.
//
// `--max-context auto` (docs/MEMORY.md, "The context"): the state that grows with the context
// (each sequence's MLA latents and token ids; a KDA state is fixed) takes at most
// kAutoContextShare of the budget the request names, and the plan must still fit: the rest is a
// floor for the trunk, the expert cache and the prompt chunks, so a longer context never starves
// the reads a token makes. The context stops at the model's limit (max_position_embeddings). An
// automatic batch is the most sequences that each get kAgentContext (else the fewest asked for),
// then the context is sized for it. A budget that grows with what runs (preset ultra or max, an
// explicit --trunk-gb/--cache-gb split) has no share to give: it plans kAgentContext, and the
// state comes on top.
//
// `--prefill-chunk auto`: the plan made for chunks of kSmallPrefillChunk, re-made for the largest
// chunk whose activations take at most kAutoPrefillShare of the budget (and at most the
// context), halved while that plan does not fit in the same budget. An explicit
// --trunk-gb/--cache-gb split stays what it says: the activations come on top of it and take
// kAutoPrefillShare of the total they make (the chunk --ram-gb of that total gets), at most what
// the RAM available holds beside the rest of the plan. --preset ultra keeps kSmallPrefillChunk.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "pipeline/memory_plan.h"

namespace k3 {

// `--prefill-chunk auto`: the largest chunk the budget holds.
inline constexpr int kAutoPrefillChunk = 0;
// `--max-context auto`: the longest context the budget holds.
inline constexpr int64_t kAutoMaxContext = 0;

// What a run asks the plan for: the budget, and the shape of the run.
struct RunRequest {
  MemoryRequest memory;
  int64_t max_context = kAutoMaxContext;  // tokens a sequence, or auto
  int prefill_chunk = kAutoPrefillChunk;  // prompt tokens per layer pass, or auto
  // Sequences at once; 0: as many as the budget holds, from min_sequences to max_sequences.
  // Fewer than asked are refused with the most the budget holds, naming the request as
  // `sequences_source` (empty: "--batch N").
  int sequences = 1;
  int min_sequences = 1;
  int max_sequences = kMaxSequences;
  std::string sequences_source;
  RingOptions ring;
};

// The run's plan: the memory plan (its context, sequences and prefill_chunk, each with the
// reason it prints) and what the engine builds from beside it.
struct RunPlan {
  MemoryPlan memory;
  uint64_t expert_slot_bytes = 0;  // one expert's cache slot
  int sequences_budget_holds = 0;  // the most sequences the budget holds, up to kMaxSequences
  std::string context_warning;     // set when auto chose less than kAgentContext: print at start
};

// Plans the run of `ckpt` under `request`. InvalidArgument (exit 2) naming the flag for a budget
// below the minimum or more sequences than it holds.
absl::StatusOr<RunPlan> PlanRun(const Checkpoint& ckpt, const RunRequest& request,
                                uint64_t available_ram_bytes);

// The plan of a rank of expert parallelism other than 0 (pipeline/ranks/worker.h): the plan one
// process would make under `request`, with all of its budget but the activations' buffers (a
// job's rows and products fit in them) and the vectors given to the expert cache, up to every
// expert, since such a rank holds no trunk, no sequence state and no lm_head.
absl::StatusOr<RunPlan> PlanExpertRank(const Checkpoint& ckpt, const RunRequest& request,
                                       uint64_t available_ram_bytes);

struct ContextChoice {
  int64_t context = 0;  // tokens a sequence; 0 when not even one token's state fits
  int sequences = 1;
  std::string source;   // why that many, for the plan's text
  std::string warning;  // set when the context is below kAgentContext (and the model's limit)
};

// The longest context (up to `limit`) that `sequences` get under the rule; 0 when none fits.
// `one` is the model's footprint for one sequence at any context.
int64_t AutoContext(const ModelFootprint& one, const MemoryRequest& request,
                    uint64_t available_ram_bytes, int64_t limit, int sequences);

// The context and the batch, from `least` to `most` sequences (equal for a batch asked for).
ContextChoice ChooseContext(const ModelFootprint& one, const MemoryRequest& request,
                            uint64_t available_ram_bytes, int64_t limit, int least, int most);

}  // namespace k3
