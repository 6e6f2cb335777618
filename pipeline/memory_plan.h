// The memory planner: splits the RAM budget the user gives (--ram-gb, a preset, or --trunk-gb
// with --cache-gb) into what must stay resident, the routers, the pinned trunk, the trunk
// streaming ring, the expert cache, sequence state and buffers (docs/MEMORY.md has the rule and
// why).
//
// The rule: fixed parts first (every layer's vectors, sequence state, buffers, top-k expert
// slots, and a ring of a few pieces when anything streams), then the routers, then the trunk
// matrices layer by layer and lm_head, each where it fits, then the expert cache; the embedding
// is resident only when the whole model is (a token reads one of its rows). RAM goes to the
// trunk before the cache because a streamed trunk byte is re-read every token, while a cache GB
// only raises a hit rate that is flat over a wide range of sizes (docs/CACHE.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/model/weights.h"

namespace k3 {

// What the user asked for; at most one of ram_gb, preset and (trunk_gb, cache_gb).
struct MemoryRequest {
  double ram_gb = 0;        // total budget in GB (1e9 bytes); 0 = not given
  std::string preset = "";  // ultra laptop desktop workstation server max auto; "" = not given
  double trunk_gb = 0;      // explicit split: routers + pinned trunk + ring ...
  double cache_gb = 0;      // ... and expert cache (both or neither)
};

// The trunk ring: `slots` slots of one piece each. A piece is up to `piece_bytes` of
// consecutive rows of one matrix (a matrix used row by row is one piece, whatever its size).
struct RingOptions {
  // 0: kDefaultPieceBytes, or less for a model whose matrices are smaller.
  uint64_t piece_bytes = 0;
  // 0: kDefaultRingSlots at the minimum, up to a typical layer ahead as the budget allows.
  int slots = 0;
  // The trunk pack the ring reads from, if any: a compressed one changes what a piece reads
  // and adds what decoding takes (ModelFootprint::ring_decode_bytes).
  const TrunkPack* pack = nullptr;
  int threads = 0;  // compute threads (0: one per core); each has a decode scratch
};
// What the budget leaves out, and peak RSS may add to it: the process itself (code and shared
// libraries, thread stacks, the tokenizer's vocabulary, allocator slack; docs/MEMORY.md).
inline constexpr uint64_t kProcessOverheadBytes = 64ull << 20;
inline constexpr uint64_t kDefaultPieceBytes = 32ull << 20;
inline constexpr int kDefaultRingSlots = 4;  // the minimum's ring
// The prompt chunk of --preset ultra, and the least `--prefill-chunk auto` takes where the budget
// allows more (a prompt's experts are read once a chunk).
inline constexpr int kSmallPrefillChunk = 64;
inline constexpr int kMaxRingSlots = 64;
// Compressed pieces decoded whole (for a row-by-row user) held at once: two in use at a time at
// most, as a ring of two slots shows.
inline constexpr int kDecodeBuffers = 2;
// Embedding rows read at once when the embedding is not resident (their buffers are planned).
inline constexpr int kEmbeddingRowsPerRead = 16;
// What one compute thread's product scratch holds at most: one token group of activations (1 MiB,
// kernels/internal/panel-inl.h) and its accumulators.
inline constexpr uint64_t kProductScratchBytes = 2ull << 20;
// `--prefill-chunk auto`: the largest chunk whose activations take at most this share of the
// budget (with an explicit split, of the split, the fixed parts and the activations on top of
// them), and at most kMaxAutoPrefillChunk tokens (docs/MEMORY.md says why a quarter).
inline constexpr double kAutoPrefillShare = 0.25;
inline constexpr int64_t kMaxAutoPrefillChunk = 65536;
// `--max-context auto`: the longest context whose growing state (MLA latents and token ids) for
// every planned sequence takes at most this share of the budget, leaving the rest a floor for
// the trunk, the expert cache and the prompt chunks (docs/MEMORY.md says why a quarter).
inline constexpr double kAutoContextShare = 0.25;
// What an agent's prompts need at least: auto below it is warned about, a budget that grows with
// what runs gets it, and an automatic batch is no larger than what holds it for each sequence.
inline constexpr int64_t kAgentContext = 32768;
// What auto plans under --preset ultra, whose point is the least memory: an agent's context would
// more than double it at Kimi K3's shapes (1.3 GB to 2.9 GB), so it keeps a chat's, and warns.
inline constexpr int64_t kUltraContext = 4096;

// The memory-relevant sizes of one checkpoint.
struct ModelFootprint {
  uint64_t embedding_bytes = 0;
  uint64_t embedding_row_bytes = 0;  // one token's row as stored
  uint64_t lm_head_bytes = 0;
  uint64_t vector_bytes = 0;           // every norm and small vector, as fp32 (resident)
  std::vector<uint64_t> router_bytes;  // per layer (0 for dense layers)
  std::vector<uint64_t> layer_bytes;   // per layer: its matrices but the router, in RAM
  // What streaming them reads: the compressed sizes from a compressed pack (empty or 0: the
  // sizes above).
  std::vector<uint64_t> layer_read_bytes, router_read_bytes;
  // Per layer: what pinning it takes when its compressed matrices are held compressed
  // (HeldCompressed; empty without a compressed pack).
  std::vector<uint64_t> layer_held_bytes;
  uint64_t lm_head_read_bytes = 0;
  uint64_t piece_bytes = 0;      // the ring's piece size in effect
  uint64_t ring_slot_bytes = 0;  // one ring slot (aligned read of a piece + widening)
  // What decoding a compressed pack's pieces takes beside the slots (0 without compressed
  // pieces): kDecodeBuffers of the largest one-piece matrix, for a row-by-row user, and each
  // compute thread's scratch for the block it decodes and multiplies (its rows and products).
  uint64_t ring_decode_bytes = 0;
  int ring_slots = 0;         // the minimum's ring
  int deep_ring_slots = 0;    // the ring once the budget allows: a typical layer read ahead
  uint64_t expert_bytes = 0;  // one routed expert as stored
  int64_t moe_layers = 0;
  uint64_t expert_slot_bytes = 0;  // one expert's cache slot (bytes plus alignment)
  uint64_t all_experts_bytes = 0;  // every routed expert in slots
  int64_t experts_per_token = 0;   // top-k
  uint64_t state_bytes = 0;        // sequence state at the planned context length, all sequences
  int64_t context = 0;             // the planned context length, in tokens a sequence
  uint64_t state_bytes_per_token = 0;    // what each token of context adds to one sequence's state
  uint64_t buffer_bytes = 0;             // activations, logits, embedding rows, I/O bookkeeping
  uint64_t prefill_bytes_per_token = 0;  // activations and streamed products a chunk token adds
  int64_t prefill_chunk = 0;             // the chunk buffer_bytes holds
  // Sequences the state and buffers are planned for (a batch), and what each one adds.
  int sequences = 1;
  uint64_t state_bytes_per_sequence = 0;
  uint64_t buffer_bytes_per_sequence = 0;  // its decode token's activations and its logits

  uint64_t all_router_bytes() const;
  uint64_t layer_read(size_t l) const {
    return l < layer_read_bytes.size() ? layer_read_bytes[l] : layer_bytes[l];
  }
  uint64_t router_read(size_t l) const {
    return l < router_read_bytes.size() ? router_read_bytes[l] : router_bytes[l];
  }
  uint64_t lm_head_read() const {
    return lm_head_read_bytes > 0 ? lm_head_read_bytes : lm_head_bytes;
  }
  uint64_t trunk_bytes() const;  // every layer's matrices but the routers
  uint64_t ring_bytes() const { return ring_slot_bytes * ring_slots + ring_decode_bytes; }
  // The same model planned for `n` sequences at once.
  ModelFootprint WithSequences(int n) const;
  // The same model planned for `tokens` of context a sequence.
  ModelFootprint WithContext(int64_t tokens) const;
};

// Whether a pinned matrix of a compressed pack is held compressed when the plan says so
// (MemoryPlan::pinned_compressed): a layer's matrix stored compressed that the forward pass
// multiplies (not one used row by row, `whole`; the routers and lm_head stay decoded).
bool HeldCompressed(const TensorSpec& spec, const PackedTensor* packed, bool whole);

// `max_context` sizes the MLA latent cache; `prefill_chunk` the activation buffers.
ModelFootprint MeasureFootprint(const Checkpoint& ckpt, int64_t max_context, int64_t prefill_chunk,
                                const RingOptions& ring = {});

struct MemoryPlan {
  std::string source;  // how the budget was chosen, e.g. "--ram-gb 12" or "preset laptop"
  int sequences = 1;   // the batch whose state is reserved
  uint64_t budget_bytes = 0;
  uint64_t minimum_bytes = 0;     // the smallest budget this model runs in
  uint64_t everything_bytes = 0;  // the budget that holds the whole model
  uint64_t vector_bytes = 0;
  uint64_t state_bytes = 0;
  uint64_t buffer_bytes = 0;
  bool embedding_resident = false;  // else one row per token read on demand
  uint64_t embedding_bytes = 0;     // resident bytes (0 when on demand)
  bool lm_head_resident = false;    // else streamed through the ring
  uint64_t lm_head_bytes = 0;
  bool routers_resident = false;  // else each layer's router goes with its layer
  uint64_t router_bytes = 0;
  std::vector<bool> pinned;  // per layer: matrices resident (true) or streamed through the ring
  // The pinned layers' compressed matrices are held compressed (a compressed pack whose trunk
  // does not fit decoded): more layers fit, and none is decoded to memory.
  bool pinned_compressed = false;
  uint64_t pinned_trunk_bytes = 0;
  int ring_slots = 0;  // 0 when nothing streams
  uint64_t ring_slot_bytes = 0;
  uint64_t ring_decode_bytes = 0;  // with ring_slots > 0: ModelFootprint::ring_decode_bytes
  uint64_t ring_bytes() const { return ring_slots * ring_slot_bytes + ring_decode_bytes; }
  uint64_t piece_bytes = 0;
  uint64_t cache_bytes = 0;
  int64_t cache_slots = 0;
  // Prompt tokens run through each layer together (the buffers hold them), and why that many.
  int64_t prefill_chunk = kSmallPrefillChunk;
  std::string prefill_chunk_source;
  // Tokens of context a sequence the state holds, and why that many.
  int64_t context = 0;
  std::string context_source;
  // What the request names before the budget is clamped to what the model takes (preset auto:
  // 70% of the RAM available); 0 when the budget grows with what runs (preset ultra or max, an
  // explicit --trunk-gb/--cache-gb split). The auto context's share is of this.
  uint64_t requested_bytes = 0;

  int64_t streamed_layers() const;
  bool streams_anything() const { return ring_slots > 0; }
  uint64_t planned_bytes() const;  // the sum of the parts (never above budget_bytes)
  // What stays in memory, for LoadTrunkWeights (the caller adds the stream handles).
  TrunkResidency residency() const;
  // The plan as the lines printed at start.
  std::string Describe() const;
};

// The pinned matrices of `plan` held compressed (none unless plan.pinned_compressed).
std::vector<const TensorInfo*> HeldCompressedTensors(const Checkpoint& ckpt, const TrunkPack* pack,
                                                     const MemoryPlan& plan);

// What one decode token reads under a plan, by the plan's arithmetic: every streamed trunk
// byte, an embedding row when it is not resident, and the routed experts the cache misses, with
// the hit rate taken as the share of all experts the cache holds (as if routing were uniform;
// on real traces the default policy does better, docs/CACHE.md).
struct ReadForecast {
  uint64_t trunk_bytes = 0;
  double hit_rate = 0;
  double expert_bytes = 0;
  double total_bytes() const { return static_cast<double>(trunk_bytes) + expert_bytes; }
};
ReadForecast ForecastReads(const ModelFootprint& footprint, const MemoryPlan& plan);

// Names of the presets, smallest first, and the fraction of the whole model each stands for
// (scaled from the budgets they mean for Kimi K3: laptop 7.8 GB, for 8 GB of peak RSS with the
// fixed overhead; desktop 64 GB, workstation 192 GB, server 512 GB of a 1.56 TB model). "ultra"
// is the minimum, "max" everything, "auto" 70 % of the RAM available (capped at everything).
const std::vector<std::string>& MemoryPresetNames();

// InvalidArgument (exit 2) for a budget below the minimum (the message states the minimum),
// an unknown preset or conflicting requests. An empty request means preset auto.
// `available_ram_bytes` is what "auto" scales from (MemAvailable).
absl::StatusOr<MemoryPlan> PlanMemory(const ModelFootprint& footprint, const MemoryRequest& request,
                                      uint64_t available_ram_bytes);

// The most sequences planned at once (a batch and the states kept beside it), and the most
// MaxSequences counts for a report ("at least" this many when the budget holds more).
inline constexpr int kMaxSequences = 64;

// The most sequences (up to `cap`) whose state the request's budget holds beside the minimum
// of everything else: 0 when not even one fits. An explicit --trunk-gb/--cache-gb split adds
// the state on top of its parts, so it holds `cap`.
int MaxSequences(const ModelFootprint& footprint, const MemoryRequest& request,
                 uint64_t available_ram_bytes, int cap);

// MemAvailable from /proc/meminfo (0 when unknown).
uint64_t AvailableRamBytes();

}  // namespace k3
