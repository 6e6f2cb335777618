// The streaming expert provider: routed experts come from the expert cache, and misses are
// read with io_uring straight into cache slots. Per MoE layer (DESIGN.md section 4):
//
//   StartFetch   orders the layer's experts (those resident or landing first, then the misses)
//                and demands the first window of them, as many as the cache has slots: the
//                misses' reads are in flight as soon as the router has chosen (the model
//                computes the latent projection meanwhile)
//   ForEachExpert  one TBB flow graph for the whole layer: an async node receives each expert
//                as its read completes (or at once for hits) and a function node multiplies it
//                into its own output slot, unpins it and demands the layer's next expert in its
//                place (a sliding window: a prefill union larger than the cache streams through
//                it with reads in flight while the compute runs); the shared experts run as a
//                third node alongside
//   Lookahead    (expert_lookahead.cc) at layer l, the routers of l+1..l+D run on l's hidden
//                state and their predicted experts are read at prefetch priority, within a cap
//                on prefetch bytes in flight and on cache slots; predictions for layers already
//                passed are cancelled
//
// With overlap off (the serial baseline) a layer's reads start only at ForEachExpert, in
// batches of as many experts as the cache has slots: all of a batch's reads complete before its
// first multiply, the shared experts run last, and nothing is prefetched. Arithmetic is the
// same either way: each expert's result has its own slot and the model sums them in a fixed
// order, so neither the order of the demands nor that of the multiplies changes a bit.
#pragma once

#include <tbb/flow_graph.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/checkpoint/checkpoint.h"
#include "core/model/expert_provider.h"
#include "core/model/weights.h"
#include "io/reads.h"
#include "pipeline/busy_clock.h"
#include "pipeline/cache/expert_cache.h"
#include "pipeline/step_metrics.h"

namespace k3 {

struct ExpertStreamOptions {
  bool overlap = true;
  int prefetch_distance = 0;          // 0 = no lookahead
  int prefill_prefetch_distance = 0;  // the same for calls with more than one token
  int prefetch_width = 0;             // experts predicted per layer and token (0 = top-k)
  uint64_t prefetch_cap_bytes = 0;    // prefetch bytes in flight at once
};

class StreamingExpertProvider : public ExpertProvider {
 public:
  // `trunk` supplies every layer's router (resident whatever the plan); `files` are the reads'
  // ids of the checkpoint's shards, in shard order; `disk` is told about every read.
  StreamingExpertProvider(const Checkpoint& ckpt, const TrunkWeights& trunk, ExpertCache& cache,
                          io::Reads& reads, std::vector<io::FileId> files, BusyClock& disk,
                          const ExpertStreamOptions& options);
  // Cancels prefetches and waits for every read still landing in a cache slot.
  ~StreamingExpertProvider() override;

  void Lookahead(int64_t layer, std::span<const float> x, size_t tokens) override;
  void StartFetch(int64_t layer, std::span<const int32_t> experts) override;
  absl::Status ForEachExpert(int64_t layer, std::span<const int32_t> experts, const ExpertUse& use,
                             const std::function<void()>& alongside) override;

  // Expert parallelism: the lookahead's guesses for experts `elsewhere` says another process
  // owns go to `forward` (to that process) instead of this cache.
  using Elsewhere = std::function<bool(int64_t layer, int32_t expert)>;
  using ForwardGuesses = std::function<void(int64_t layer, std::vector<int32_t> experts)>;
  void ShareGuesses(Elsewhere elsewhere, ForwardGuesses forward) {
    elsewhere_ = std::move(elsewhere);
    forward_ = std::move(forward);
  }
  // Reads guesses another process made for `layer` at prefetch priority, within the cap.
  void Prefetch(int64_t layer, std::span<const int32_t> experts);

  // Adds the figures since the last call to `m` (expert bytes, cache, stall, prefetch).
  void TakeMetrics(StepMetrics& m);
  // Starts the per-layer figures of a step (LayerFigures' times count from now).
  void BeginStep();
  // The figures of the MoE layers the current or last step ran, in layer order, into `out`
  // (whose storage is reused).
  void StepLayers(std::vector<LayerFigures>& out) const;
  std::vector<PrefetchAccuracy> accuracy() const;

 private:
  enum class WantState { kWaiting, kReady, kFailed };
  // One expert of the layer being computed.
  struct Want {
    ExpertKey key;
    WantState state = WantState::kWaiting;
    std::span<const uint8_t> bytes;  // the expert inside its cache slot, once ready
  };
  // A read in flight into a cache slot.
  struct Pending {
    io::ReadId id = 0;
    bool prefetch = false;
    bool demanded = false;        // a demand is waiting on it (never cancel)
    std::vector<size_t> waiters;  // indices into wants_
    std::span<uint8_t> slot;
  };

  uint64_t ExpertBytes() const { return ckpt_.config().expert_bytes(); }
  std::span<const uint8_t> InSlot(const ExpertKey& key, std::span<uint8_t> slot) const;
  // Starts the demand for wants_[i] and pins its slot; may wait for a slot. A hard error marks
  // the want failed and sets error_.
  void Demand(size_t i);
  bool DemandLocked(size_t i, const CacheGrant& grant);
  void SubmitRead(const ExpertKey& key, std::span<uint8_t> slot, bool prefetch);
  void OnRead(const ExpertKey& key, io::ReadResult result);
  void Finish(size_t i, bool ok, std::span<const uint8_t> bytes);
  // Sets up the layer's wants and the order to demand them in, and demands the first window.
  void StartLayer(int64_t layer, std::span<const int32_t> experts);
  // Demands order_[demanded_, end).
  void DemandThrough(size_t end);
  // The next want of the layer to demand, taken off order_ (once a multiply has given its slot
  // back); kNone when every want has been demanded or a read failed.
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  size_t TakeNextDemand();
  // The overlapped layer: one flow graph, the window sliding over order_.
  absl::Status RunWindow(const ExpertUse& use, const std::function<void()>& alongside);
  // The serial baseline's batch order_[first, demanded_): every read, then every multiply.
  absl::Status RunBatchSerial(const ExpertUse& use, size_t first,
                              const std::function<void()>& alongside);
  void ScorePredictions(int64_t layer, std::span<const int32_t> experts);
  void Predict(int64_t layer, int distance, std::span<const float> x, size_t tokens);
  void TryPrefetch(const ExpertKey& key);
  // Drops the pins that keep guesses for layers <= `layer` (kAllLayers: every guess) from being
  // evicted before their layer asks for them.
  static constexpr int64_t kAllLayers = std::numeric_limits<int64_t>::max();
  void ReleaseGuardsLocked(int64_t layer);
  void CancelStalePrefetches(int64_t layer);
  // The step's figures of `layer`, under mu_: a read of it landed; its multiplies ran from
  // `start` to `end`.
  void NoteArrival(int64_t layer);
  void NoteCompute(int64_t layer, std::chrono::steady_clock::time_point start,
                   std::chrono::steady_clock::time_point end);
  // Wants pinned at once: the cache's slots (at least one).
  size_t Window() const;

  const Checkpoint& ckpt_;
  const TrunkWeights& trunk_;
  ExpertCache& cache_;
  io::Reads& reads_;
  const std::vector<io::FileId> files_;
  BusyClock& disk_;
  const ExpertStreamOptions options_;
  Elsewhere elsewhere_;
  ForwardGuesses forward_;

  mutable std::mutex mu_;
  std::mutex handoff_mu_;            // held by OnRead while it hands reads to the flow graph
  std::condition_variable changed_;  // a want finished; the last read landed
  int64_t layer_ = -1;               // the layer StartLayer set up, until its ForEachExpert returns
  std::vector<Want> wants_;          // wants_[i] is experts[i] of the layer's call
  std::vector<size_t> order_;        // indices into wants_ in the order they are demanded
  size_t demanded_ = 0;              // order_[0, demanded_) have been demanded
  absl::Status error_;               // first failed read of the layer
  // While a layer's flow graph runs: which wants wait in it for their read (OnRead then hands
  // them over through the graph's gateway), and the gateway.
  using Gateway = tbb::flow::async_node<size_t, size_t>::gateway_type;
  std::vector<bool> waiting_;
  Gateway* gateway_ = nullptr;
  absl::flat_hash_map<ExpertKey, Pending> pending_;
  absl::flat_hash_set<ExpertKey> prefetched_unused_;
  // Guesses hold a pin from their prefetch until their layer's demands have pinned what they
  // use: otherwise a demand fill earlier in the pass (or in the same layer) could evict a right
  // guess just before it is asked for, and the disk would read it twice.
  absl::flat_hash_set<ExpertKey> guarded_;
  uint64_t prefetch_bytes_in_flight_ = 0;
  // predictions_[layer][distance]: experts predicted for `layer` from `distance` layers before.
  std::map<int64_t, std::map<int, std::vector<int32_t>>> predictions_;
  std::vector<PrefetchAccuracy> accuracy_;  // decode steps only
  bool prefill_pass_ = false;               // the current Forward call has several tokens
  StepMetrics metrics_;                     // since the last TakeMetrics
  // The step's figures by layer (sized once: a step records without allocating), and when the
  // step began.
  std::vector<LayerFigures> layers_;
  std::chrono::steady_clock::time_point step_start_ = std::chrono::steady_clock::now();
  double StepMs(std::chrono::steady_clock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - step_start_).count();
  }
};

}  // namespace k3
