// `--max-context auto`: the context a sequence gets, and the automatic batch beside it, from the
// memory budget (docs/MEMORY.md, "The context").
//
// The rule: the state that grows with the context (each sequence's MLA latents and token ids; a
// KDA state is fixed) takes at most kAutoContextShare of the budget the request names, and the
// plan must still fit: the rest is a floor for the trunk, the expert cache and the prompt
// chunks, so a longer context never starves the reads a token makes. The context stops at the
// model's limit (max_position_embeddings). An automatic batch is the most sequences that each
// get kAgentContext (else the fewest asked for), then the context is sized for it. A budget that
// grows with what runs (preset ultra or max, an explicit --trunk-gb/--cache-gb split) has no
// share to give: it plans kAgentContext, and the state comes on top.
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/memory_plan.h"

namespace k3 {

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
