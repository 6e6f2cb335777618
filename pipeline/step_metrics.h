// What a run of the engine measures: the figures of its steps (StepMetrics, summed over calls)
// and how well the lookahead predicted the experts (PrefetchAccuracy).
#pragma once

#include <cstdint>

#include "nlohmann/json.hpp"

namespace k3 {

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
  // Expert parallelism (pipeline/ranks/): bytes sent to and received from the other ranks, and
  // the time rank 0 waited for their products after its own experts were done.
  uint64_t exchange_bytes = 0;
  double exchange_wait_seconds = 0;

  void Add(const StepMetrics& other);
  double hit_rate() const;
  double prefetch_precision() const;
  double prefetch_recall() const;
  nlohmann::json ToJson() const;
};

// One MoE layer of one step, as the live view of the engine shows it (GET /k3/events): how
// its experts came and when their bytes and their compute ran. Kept in a fixed array, one
// entry per layer, filled under the locks the provider takes anyway.
struct LayerFigures {
  int32_t layer = -1;       // -1: the layer ran no experts in the step
  uint32_t asked = 0;       // distinct experts its tokens chose (the union over the step's rows)
  uint32_t cached = 0;      // of them, resident or already landing when asked for
  uint32_t read = 0;        // of them, read on demand
  uint32_t prefetched = 0;  // of the cached, those the lookahead had read ahead
  // Milliseconds from the step's start: the first and last of the layer's expert reads that
  // landed in the step (demanded or prefetched; -1: none), and the first multiply's start and
  // the last one's end (-1: none).
  double bytes_first_ms = -1, bytes_last_ms = -1;
  double compute_start_ms = -1, compute_end_ms = -1;
};

// Prediction quality at one lookahead distance, over the run so far.
struct PrefetchAccuracy {
  int distance = 0;
  uint64_t predicted = 0, correct = 0, actual = 0;
  double precision() const { return predicted ? double(correct) / predicted : 0; }
  double recall() const { return actual ? double(correct) / actual : 0; }
};

}  // namespace k3
