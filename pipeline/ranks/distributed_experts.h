// Rank 0's side of expert parallelism: an ExpertProvider that multiplies the experts rank 0
// owns with the local streaming provider and sends the rows of every other expert to the rank
// that owns it (pipeline/ranks/partition.h), whose products come back while the local experts
// and the shared experts run. The model sums every product in its fixed order, so the output
// is bit-identical to one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/expert_provider.h"
#include "pipeline/ranks/identity.h"
#include "pipeline/ranks/partition.h"
#include "pipeline/ranks/protocol.h"
#include "pipeline/step_metrics.h"

namespace k3::ranks {

// What went over the wire to and from one rank, over the run so far.
struct RankTraffic {
  int rank = 0;
  std::string host;
  uint64_t bytes_out = 0;     // rows and job headers sent
  uint64_t bytes_back = 0;    // products received
  int64_t layers = 0;         // layer jobs
  double seconds = 0;         // from each job's send until its products were in
  double worker_seconds = 0;  // of which the rank spent reading and multiplying (its own clock)
  // Measured at start: the median round trip of a decode layer's job and products (no compute),
  // and their bytes.
  double ping_seconds = 0;
  uint64_t ping_bytes = 0;
  RankCapacity capacity;  // what it brought: its cache and its drives' rate
};

class DistributedExperts : public ExpertProvider, public RemoteExperts {
 public:
  // Tells every worker to open the checkpoint and learns what each brings, then partitions the
  // experts by `own` (rank 0's capacity) and theirs. An error names the rank that failed; a rank
  // whose SIMD target or checkpoint differs from rank 0's `identity` is refused
  // (FailedPrecondition naming it and both values).
  static absl::StatusOr<std::unique_ptr<DistributedExperts>> Connect(const ModelConfig& config,
                                                                     ExpertProvider& local,
                                                                     const RankCapacity& own,
                                                                     const RankIdentity& identity);

  // ExpertProvider: rank 0's own experts.
  void Lookahead(int64_t layer, std::span<const float> x, size_t tokens) override {
    local_.Lookahead(layer, x, tokens);
  }
  void StartFetch(int64_t layer, std::span<const int32_t> experts) override {
    local_.StartFetch(layer, experts);
  }
  absl::Status ForEachExpert(int64_t layer, std::span<const int32_t> experts, const ExpertUse& use,
                             const std::function<void()>& alongside) override {
    return local_.ForEachExpert(layer, experts, use, alongside);
  }
  RemoteExperts* remote() override { return this; }

  // RemoteExperts: the other ranks'.
  bool Remote(int64_t layer, int32_t expert) const override {
    return partition_.owner(layer, expert) != 0;
  }
  absl::Status Start(int64_t layer, std::span<const int32_t> experts,
                     std::span<const size_t> counts, std::span<const size_t> tokens,
                     std::span<const float> x) override;
  absl::Status Finish(std::span<float> products) override;

  const ExpertPartition& partition() const { return partition_; }
  // "  ranks                 3 (expert parallelism): rank 0 on a 42.7 experts a layer (33%), ..."
  std::string Describe() const;
  std::vector<RankTraffic> traffic() const { return traffic_; }
  // Adds the exchange's bytes and Finish's wait since the last call.
  void TakeMetrics(StepMetrics& m);
  // The lookahead's guesses of `layer` for experts other ranks own go to them (kPrefetch).
  void ForwardGuesses(int64_t layer, const std::vector<int32_t>& experts);

 private:
  DistributedExperts(const ModelConfig& config, ExpertProvider& local, ExpertPartition partition,
                     const std::vector<RankCapacity>& capacity);
  // Times round trips of a decode layer's sizes to every rank (RankTraffic::ping_seconds).
  absl::Status MeasureLinks();

  // One layer's job for one rank, kept until its products are in.
  struct Job {
    LayerJob job;
    std::vector<int64_t> header;  // its encoding, kept until sent
    std::vector<size_t> at;       // where each of its experts' pairs start in Start's `tokens`
  };

  const ModelConfig& config_;
  ExpertProvider& local_;
  ExpertPartition partition_;
  std::vector<Job> jobs_;                      // by rank
  std::vector<std::vector<int64_t>> guesses_;  // sent since the last Finish (kept until sent)
  int64_t layer_ = -1;
  std::chrono::steady_clock::time_point started_;
  std::vector<RankTraffic> traffic_;
  StepMetrics metrics_;
};

}  // namespace k3::ranks
