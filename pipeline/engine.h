// The engine: one object that opens a checkpoint, plans memory, and runs tokens through the
// model with the streaming pipeline (expert cache + io_uring reads + TBB flow graph +
// lookahead prefetch + trunk ring). Every command drives it through the batch scheduler
// (pipeline/batch_scheduler.h: Step for a batch, RunSequence for one sequence); Prefill and
// Decode run one sequence directly, as the tests' reference runs do:
//
//   auto engine = Engine::Open(options);          // plan printed by the caller: plan().Describe()
//   SequenceState state = (*engine)->NewState();
//   (*engine)->Prefill(prompt_ids, state, logits, &m);   // chunks of prefill_chunk()
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
#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "core/model/sequence_state.h"
#include "io/read_replay.h"
#include "io/read_router.h"
#include "nlohmann/json.hpp"
#include "pipeline/engine_options.h"
#include "pipeline/memory_plan.h"
#include "pipeline/ranks/distributed_experts.h"
#include "pipeline/run_plan.h"
#include "pipeline/step_metrics.h"

namespace k3 {

class Engine {
 public:
  // Opens the checkpoint (and pack), plans memory (InvalidArgument below the minimum), loads
  // the pinned trunk, sets up the cache and the read router.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options);
  ~Engine();

  const Checkpoint& checkpoint() const;
  const ModelConfig& config() const;
  const MemoryPlan& plan() const;
  const EngineOptions& options() const;
  // The sequences planned (EngineOptions::sequences, or what the budget holds), and the most
  // the budget holds beside the model, counted up to kMaxSequences.
  int sequences() const;
  int sequences_budget_holds() const;
  // Prompt tokens per layer pass: EngineOptions::prefill_chunk, or the one auto chose.
  int64_t prefill_chunk() const;
  // Tokens of context a sequence: EngineOptions::max_context, or the one auto chose.
  int64_t max_context() const;
  // Layers run over every step so far (Model::layers_run): the clock a cancellation counts in.
  int64_t layers_run() const;
  // Set when auto chose a context shorter than an agent needs (kAgentContext): the line to print
  // at start.
  const std::string& context_warning() const;
  // Every setting in effect, for reports.
  nlohmann::json Settings() const;
  // How the checkpoint is read, one line for under the memory plan: the backend, and O_DIRECT
  // or the buffered fallback where the file system refused it.
  std::string DescribeReads() const;
  SequenceState NewState() const;

  // Runs `ids` after the tokens in `state` in chunks of prefill_chunk(); logits of the last
  // token. `metrics` (optional) receives the sum over the chunks.
  absl::Status Prefill(std::span<const int32_t> ids, SequenceState& state,
                       std::vector<float>& logits, StepMetrics* metrics = nullptr);
  absl::Status Decode(int32_t id, SequenceState& state, std::vector<float>& logits,
                      StepMetrics* metrics = nullptr);
  // One Forward call over all of `ids` (no chunking); with all_positions the logits of every
  // token. For tests.
  absl::Status Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                       std::vector<float>& logits, StepMetrics* metrics = nullptr);

  // One batched step (continuous batching, pipeline/batch_scheduler.h): every segment's tokens
  // in one trunk pass and one read of their experts' union; logits of each segment's last
  // token, [segments.size(), vocab]. Each segment's result equals running it alone.
  // `observer` (optional) is called after each layer, on the calling thread: how far a long
  // prompt chunk has gone while it runs.
  absl::Status Step(std::span<const BatchSegment> segments, std::vector<float>& logits,
                    StepMetrics* metrics = nullptr, const LayerObserver& observer = {});

  std::vector<PrefetchAccuracy> prefetch_accuracy() const;
  // The MoE layers of the last call (Step, Forward, Decode; Prefill's last chunk): their
  // experts and timeline (LayerFigures), in layer order, into `out` (its storage reused).
  void StepLayers(std::vector<LayerFigures>& out) const;
  // Each drive read from (one with no volumes): its directories, profile, bytes, busy time and
  // the rate reads are routed by, so far.
  std::vector<io::DeviceReport> devices() const;
  // Under expert parallelism (mpirun with several ranks): what went to and from each rank so far
  // (rank 0's own entry counts nothing); empty in one process.
  std::vector<ranks::RankTraffic> ranks() const;

  // Records the reads of the calls from now on, until TakeReadLog: what the run had to read, to
  // replay without the compute for its I/O floor (io/read_replay.h, k3 bench).
  void StartReadLog();
  io::ReadLog TakeReadLog();

 private:
  struct Parts;  // the checkpoint, plan, cache, reads and model (pipeline/engine.cc)
  explicit Engine(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace k3
