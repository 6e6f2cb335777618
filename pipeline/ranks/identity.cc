#include "pipeline/ranks/identity.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "io/file.h"
#include "kernels/dispatch.h"
#include "pipeline/ranks/comm.h"

namespace k3::ranks {
namespace {

// As Checkpoint::Open looks for them: the index of the shards first, else the single file.
absl::StatusOr<std::string> CheckpointIdentity(const std::string& dir) {
  std::string name = "model.safetensors.index.json";
  if (!io::FileExists(io::JoinPath(dir, name))) name = "model.safetensors";
  auto file = io::RandomAccessFile::Open(io::JoinPath(dir, name));
  if (!file.ok()) return file.status();
  std::vector<uint8_t> head(std::min<uint64_t>((*file)->size(), kIdentityBytes));
  if (absl::Status s = (*file)->ReadAt(0, head); !s.ok()) return s;
  return absl::StrFormat("%s, %d bytes, xxh3 %016x", name, (*file)->size(),
                         XXH3_64bits(head.data(), head.size()));
}

}  // namespace

absl::StatusOr<RankIdentity> IdentifyRank(const std::string& model_dir) {
  RankIdentity id;
  const char* fake = std::getenv("K3_FAKE_SIMD_TARGET");
  id.simd_target = fake != nullptr && *fake != '\0' ? std::string(fake)
                                                    : std::string(kernels::ActiveKernelTarget());
  auto checkpoint = CheckpointIdentity(model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  id.checkpoint = *std::move(checkpoint);
  return id;
}

absl::Status CheckLikeRank0(const RankIdentity& own, const RankIdentity& theirs, int rank) {
  if (theirs.simd_target != own.simd_target) {
    return absl::FailedPreconditionError(absl::StrCat(
        Name(rank), " runs the kernels on SIMD target ", theirs.simd_target, " where ", Name(0),
        " runs them on ", own.simd_target,
        ": their products would differ in the last bits; run every rank on the same kind of CPU"));
  }
  if (theirs.checkpoint != own.checkpoint) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(rank), " opened checkpoint ", theirs.checkpoint, " where ", Name(0),
                     " opened ", own.checkpoint, ": every rank needs the same checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace k3::ranks
