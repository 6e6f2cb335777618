// What must be alike on every rank of expert parallelism for the output to stay bit-identical to
// one process: the SIMD target the kernels run on (a product's bits depend on it: another target
// sums in another order) and the checkpoint each rank opened. Every rank reports both when it
// connects; rank 0 refuses a rank whose values differ from its own (docs/SCALE.md).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace k3::ranks {

struct RankIdentity {
  // The target the kernels' dispatch runs (kernels::ActiveKernelTarget()), e.g. "AVX2"; tests
  // only: K3_FAKE_SIMD_TARGET names another.
  std::string simd_target;
  // The first file the checkpoint code reads (the shards' index, or the single shard): its name,
  // size and the XXH3-64 of its first kIdentityBytes, e.g.
  // "model.safetensors.index.json, 48213 bytes, xxh3 9f2c...". The same layout gives the same
  // value whatever directory it lies in; the weights' bytes are not read.
  std::string checkpoint;
};

inline constexpr uint64_t kIdentityBytes = 1 << 20;

// This process's identity, with the checkpoint in `model_dir`.
absl::StatusOr<RankIdentity> IdentifyRank(const std::string& model_dir);

// FailedPrecondition naming `rank` (and its host) and both values where `theirs` differs from
// rank 0's `own`.
absl::Status CheckLikeRank0(const RankIdentity& own, const RankIdentity& theirs, int rank);

}  // namespace k3::ranks
