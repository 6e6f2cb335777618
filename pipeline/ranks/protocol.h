// The messages between rank 0 and the other ranks of expert parallelism (comm.h's tags), each a
// struct with its encoding (what goes on the wire) and its decoding, which refuses a message cut
// short or garbled with an error saying what is wrong, so that a rank never multiplies rows it
// misread and rank 0 never sums products it misread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint/config.h"
#include "pipeline/ranks/identity.h"
#include "pipeline/ranks/partition.h"

namespace k3::ranks {

// kInfo: a worker's answer to kHello, as JSON text.
struct WorkerInfo {
  std::string error;  // set when it could not open its experts (then nothing else is)
  RankCapacity capacity;
  RankIdentity identity;
};
std::string EncodeWorkerInfo(const WorkerInfo& info);
absl::StatusOr<WorkerInfo> DecodeWorkerInfo(std::string_view text);

// kJob and kRows: one layer's rows for the experts one rank owns.
struct LayerJob {
  int64_t layer = 0;
  std::vector<int32_t> experts;  // the rank's experts the layer's tokens chose
  std::vector<size_t> counts;    // the rows each multiplies
  // Each (expert, row) pair's row in `rows`, the experts' pairs one after the other.
  std::vector<size_t> row_of;
  // [rows, routed_expert_hidden_size]: each token's row once, however many of the rank's experts
  // use it.
  std::vector<float> rows;
};
// kJob's int64s: {layer, experts, rows, expert ids..., row counts..., each pair's row...}; the
// rows go as they are, in kRows.
std::vector<int64_t> EncodeJobHeader(const LayerJob& job, size_t latent);
absl::StatusOr<LayerJob> DecodeLayerJob(std::span<const int64_t> header, std::vector<float> rows,
                                        const ModelConfig& config);

// kProducts: a job's answer.
struct LayerResult {
  std::vector<float> products;  // one row per pair of the job, in its order
  double seconds = 0;           // the rank's own time on the job (reads and multiplies)
};
// {products..., seconds}: floats, the seconds last.
std::vector<float> EncodeLayerResult(LayerResult result);
// The answer to a job of `pairs` pairs.
absl::StatusOr<LayerResult> DecodeLayerResult(std::vector<float> message, size_t pairs,
                                              size_t latent);

// kPrefetch: rank 0's lookahead guessed these of the rank's experts for a later layer.
struct LayerGuess {
  int64_t layer = 0;
  std::vector<int32_t> experts;
};
// {layer, expert ids...}
std::vector<int64_t> EncodeLayerGuess(const LayerGuess& guess);
absl::StatusOr<LayerGuess> DecodeLayerGuess(std::span<const int64_t> message,
                                            const ModelConfig& config);

}  // namespace k3::ranks
