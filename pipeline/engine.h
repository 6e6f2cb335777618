// The engine: one object that opens a checkpoint, plans memory, and runs tokens through the
// model with the streaming pipeline (expert cache + io_uring reads + TBB flow graph +
// lookahead prefetch + trunk ring). `k3 generate`, `k3 chat` and `k3 bench` all drive it.
//
//   auto engine = Engine::Open(options);          // plan printed by the caller: plan().Describe()
//   SequenceState state = (*engine)->NewState();
//   (*engine)->Prefill(prompt_ids, state, logits, &m);   // chunks of options.prefill_chunk
//   (*engine)->Decode(id, state, logits, &m);            // one token
//
// Output is bit-identical at every setting (DESIGN.md invariant 1): the settings change where
// bytes come from and when, never the arithmetic.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/model/model.h"
#include "core/model/sequence_state.h"
#include "io/fault_injection.h"
#include "io/read_replay.h"
#include "nlohmann/json.hpp"
#include "pipeline/memory_plan.h"

namespace k3 {

struct EngineOptions {
  std::string model_dir;
  std::string trunk_dir;  // a `k3 pack` output; empty: streamed trunk layers read from shards
  MemoryRequest memory;
  int64_t max_context = 4096;  // sizes the planned sequence state
  int sequences = 1;           // sequences run at once (a batch): state reserved for each
  int queue_depth = 32;        // reads in flight
  int prefetch_distance = 0;   // layers of lookahead (0 = off; docs/PERFORMANCE.md for why)
  // The same for prompt chunks (prefill), which multiply many tokens per expert and so are
  // compute-bound: reading the next layer's likely experts during that compute costs no time.
  int prefill_prefetch_distance = 1;
  int prefetch_width = 0;              // experts predicted per layer (0 = the model's top-k)
  double prefetch_cap_fraction = 0.5;  // prefetch bytes in flight, as a fraction of the cache
  int threads = 0;                     // compute threads (0 = one per core)
  bool overlap = true;       // false: the serial baseline (read a layer's experts, then compute)
  std::string cache_policy;  // empty: the default policy
  std::string storage_profile = "direct";
  int prefill_chunk = 64;
  // The trunk ring (docs/MEMORY.md): the size of a piece and the number of slots; 0 = the
  // defaults (kDefaultPieceBytes, kDefaultRingSlots).
  uint64_t ring_piece_bytes = 0;
  int ring_slots = 0;
  bool direct_io = true;       // O_DIRECT (false only for tests on file systems that refuse it)
  bool show_progress = false;  // progress bar for the first trunk load
  std::shared_ptr<io::FaultPlan> faults;  // tests: faults injected into every read
};

// Figures of one Forward call (a prefill chunk or a decode step), or sums of several.
struct StepMetrics {
  int64_t tokens = 0;
  double seconds = 0;
  double io_wait_seconds = 0;       // compute stopped, waiting for bytes (experts or trunk)
  double trunk_wait_seconds = 0;    // the part of it spent waiting for trunk pieces or rows
  double trunk_decode_seconds = 0;  // decoding compressed trunk pieces (sum over threads)
  // Where compressed pieces were decoded: in the product, block by block as it multiplies
  // (fused), or whole, for a row-by-row user (MLA's kv_b).
  uint64_t trunk_pieces_decoded_fused = 0;
  uint64_t trunk_pieces_decoded_whole = 0;
  double disk_busy_seconds = 0;  // at least one read in flight
  uint64_t expert_demand_bytes = 0;
  uint64_t expert_prefetch_used_bytes = 0;    // prefetched, then demanded
  uint64_t expert_prefetch_wasted_bytes = 0;  // prefetched, evicted or dropped unused
  uint64_t trunk_bytes = 0;
  // Trunk pieces asked for before the ring had read them ahead (0 in a healthy run).
  uint64_t trunk_pieces_out_of_order = 0;
  uint64_t experts_demand_read = 0;  // expert reads issued by demand
  uint64_t cache_requests = 0;       // demanded experts
  uint64_t cache_hits = 0;           // already resident (prefetched or cached)
  uint64_t prefetch_predicted = 0;   // predictions checked against the truth
  uint64_t prefetch_correct = 0;
  uint64_t routed_experts = 0;  // demanded experts the predictions are scored on
  // Where the time goes, beside the stall: issuing reads (cache lookups, waits for a free
  // slot), running the lookahead routers, and multiplying experts (busy time of the experts'
  // flow-graph nodes, any thread).
  double fetch_seconds = 0;
  double lookahead_seconds = 0;
  double expert_compute_seconds = 0;

  void Add(const StepMetrics& other);
  double hit_rate() const;
  double prefetch_precision() const;
  double prefetch_recall() const;
  nlohmann::json ToJson() const;
};

// Prediction quality at one lookahead distance, over the run so far.
struct PrefetchAccuracy {
  int distance = 0;
  uint64_t predicted = 0, correct = 0, actual = 0;
  double precision() const { return predicted ? double(correct) / predicted : 0; }
  double recall() const { return actual ? double(correct) / actual : 0; }
};

class Engine {
 public:
  // Opens the checkpoint (and pack), plans memory (InvalidArgument below the minimum), loads
  // the pinned trunk, sets up the cache and the read engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  virtual ~Engine() = default;

  virtual const Checkpoint& checkpoint() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const MemoryPlan& plan() const = 0;
  virtual const EngineOptions& options() const = 0;
  // Every setting in effect, for reports.
  virtual nlohmann::json Settings() const = 0;
  // How the checkpoint is read, one line for under the memory plan: the backend, and O_DIRECT
  // or the buffered fallback where the file system refused it.
  virtual std::string DescribeReads() const = 0;
  virtual SequenceState NewState() const = 0;

  // Runs `ids` after the tokens in `state` in chunks of prefill_chunk; logits of the last
  // token. `metrics` (optional) receives the sum over the chunks.
  virtual absl::Status Prefill(std::span<const int32_t> ids, SequenceState& state,
                               std::vector<float>& logits, StepMetrics* metrics = nullptr) = 0;
  virtual absl::Status Decode(int32_t id, SequenceState& state, std::vector<float>& logits,
                              StepMetrics* metrics = nullptr) = 0;
  // One Forward call over all of `ids` (no chunking); with all_positions the logits of every
  // token. For tests.
  virtual absl::Status Forward(std::span<const int32_t> ids, SequenceState& state,
                               bool all_positions, std::vector<float>& logits,
                               StepMetrics* metrics = nullptr) = 0;

  // One batched step (continuous batching, pipeline/batch_scheduler.h): every segment's tokens
  // in one trunk pass and one read of their experts' union; logits of each segment's last
  // token, [segments.size(), vocab]. Each segment's result equals running it alone.
  virtual absl::Status Step(std::span<const BatchSegment> segments, std::vector<float>& logits,
                            StepMetrics* metrics = nullptr) = 0;

  virtual std::vector<PrefetchAccuracy> prefetch_accuracy() const = 0;

  // Records the reads of the calls from now on, until TakeReadLog: what the run had to read, to
  // replay without the compute for its I/O floor (io/read_replay.h, k3 bench).
  virtual void StartReadLog() = 0;
  virtual io::ReadLog TakeReadLog() = 0;
};

}  // namespace k3
