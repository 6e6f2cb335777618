// The trunk pack (`k3 pack`): every non-expert tensor of a checkpoint copied verbatim into one
// file, one 4 KiB-aligned run per layer plus one for the globals, so that the trunk streamer
// reads a layer's trunk with one large O_DIRECT read instead of dozens of small reads scattered
// over the shards. A manifest (trunk.json) records where each tensor landed and a CRC-32C of its
// bytes. The pack is an optimisation, never a requirement: the engine runs from the checkpoint
// as released (DESIGN.md section 3.4). Format: docs/PACK.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/safetensors.h"

namespace k3 {

inline constexpr char kTrunkPackFile[] = "trunk.pack";
inline constexpr char kTrunkManifestFile[] = "trunk.json";
inline constexpr char kTrunkPackFormat[] = "k3-trunk-pack";
// Version 1: every tensor verbatim. Version 2: BF16 matrices compressed (docs/PACK.md); a k3
// that reads only version 1 refuses it rather than read compressed bytes as weights.
inline constexpr int kTrunkPackVersion = 1;
inline constexpr int kCompressedPackVersion = 2;
// The codec of version 2 packs (kernels/bf16_codec.h) and the version of its block format.
inline constexpr char kBf16Codec[] = "bf16-e3";
inline constexpr int kPackCodecVersion = 1;
// Run offsets and lengths are multiples of this (O_DIRECT needs it for offset, length and
// buffer); tensors start at multiples of kTensorAlignment inside a run (SIMD loads).
inline constexpr uint64_t kRunAlignment = 4096;
inline constexpr uint64_t kTensorAlignment = 64;

// One compressed block: `rows` consecutive rows of a matrix, encoded on their own
// (kernels/bf16_codec.h), at a 4 KiB-aligned offset.
struct PackedBlock {
  uint64_t offset = 0;  // absolute, in the pack file
  uint64_t length = 0;  // stored bytes
  uint64_t rows = 0;
  uint64_t hash = 0;  // XXH3-64 of the stored bytes
};

struct PackedTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute, in the pack file
  uint64_t length = 0;  // the tensor's bytes (decoded)
  uint64_t hash = 0;    // CRC-32C of the bytes (decoded)
  // Compressed tensors only: the codec's name and its blocks, which together cover the rows in
  // order and lie in [offset, offset + stored). Verbatim tensors: no blocks, stored == length.
  std::string codec;
  std::vector<PackedBlock> blocks;
  uint64_t stored = 0;
  bool compressed() const { return !blocks.empty(); }
};

struct PackedRun {
  int64_t layer = -1;   // -1 = globals
  uint64_t offset = 0;  // absolute, in the pack file
  uint64_t length = 0;  // a multiple of kRunAlignment (zero padding at the end)
  std::vector<PackedTensor> tensors;
};

class TrunkPack {
 public:
  // Reads dir/trunk.json and checks it against the checkpoint: same config fingerprint, every
  // trunk tensor present once in its layer's run with the checkpoint's dtype, shape and byte
  // length, nothing else, and the pack file of the recorded size. Errors name the manifest
  // and the key or tensor at fault: InvalidArgument or NotFound, DataLoss for a pack file
  // shorter than recorded.
  static absl::StatusOr<std::unique_ptr<TrunkPack>> Open(const std::string& dir,
                                                         const Checkpoint& ckpt);
  // Parses a manifest without a checkpoint (structure only: types, alignment, runs inside the
  // recorded pack size and not overlapping, tensors inside their run). `source_name` is the
  // manifest's path; the pack file is looked for beside it.
  static absl::StatusOr<std::unique_ptr<TrunkPack>> ParseManifest(std::string_view json,
                                                                  const std::string& source_name);

  const std::string& manifest_path() const { return manifest_path_; }
  const std::string& pack_path() const { return pack_path_; }
  uint64_t pack_bytes() const { return pack_bytes_; }
  const std::string& fingerprint() const { return fingerprint_; }
  // The codec of the compressed tensors ("" for a verbatim pack).
  const std::string& codec() const { return codec_; }
  // Bytes of the trunk tensors as stored (compressed where they are) and decoded.
  uint64_t stored_tensor_bytes() const;
  uint64_t tensor_bytes() const;
  const PackedRun* layer_run(int64_t layer) const;  // nullptr if absent; -1 = globals
  const PackedTensor* Find(const std::string& name) const;
  const std::vector<PackedRun>& runs() const { return runs_; }
  int64_t tensor_count() const { return static_cast<int64_t>(by_name_.size()); }

  // The checkpoint half of Open: the manifest against the checkpoint and the pack file's size.
  absl::Status CheckAgainst(const Checkpoint& ckpt) const;

 private:
  TrunkPack() = default;
  absl::Status Index();

  std::string manifest_path_;
  std::string pack_path_;
  uint64_t pack_bytes_ = 0;
  std::string fingerprint_;
  std::string codec_;
  std::vector<PackedRun> runs_;  // in file order
  absl::flat_hash_map<int64_t, size_t> by_layer_;
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> by_name_;  // run, tensor
};

struct PackOptions {
  bool show_progress = false;
  bool verify = true;
  std::string codec;         // "" = verbatim; else a name of PackCodecNames()
  uint64_t block_bytes = 0;  // compressed blocks' decoded size; 0 = kBlockTargetBytes
};

// The codecs `k3 pack --codec` knows, and whether `name` is one of them.
const std::vector<std::string>& PackCodecNames();
bool IsPackCodec(const std::string& name);

struct PackResult {
  uint64_t bytes = 0;         // size of trunk.pack
  uint64_t tensor_bytes = 0;  // the trunk's tensors, decoded
  int64_t tensors = 0;
  double seconds = 0;  // writing and, when asked, verifying
};

// Writes out_dir/trunk.pack and trunk.json; an unknown codec is InvalidArgument before anything
// is touched. Each goes to a .partial file renamed at the end, the
// manifest last and only after the pack verified (when options.verify), and a stale manifest is
// removed first: an interrupted or failed pack never leaves a pair that Open accepts. Write
// errors name the output file; partial files are removed.
absl::StatusOr<PackResult> WriteTrunkPack(const Checkpoint& ckpt, const std::string& out_dir,
                                          const PackOptions& options);

// Re-reads every tensor from the pack and from the checkpoint and compares bytes and the
// manifest's hashes. DataLoss naming the tensor, the pack file and the offset of the first
// difference. `progress(done, total)` reports bytes of the pack.
absl::Status VerifyTrunkPack(
    const Checkpoint& ckpt, const TrunkPack& pack,
    const std::function<void(uint64_t done, uint64_t total)>& progress = {});

// CRC-32C (Castagnoli) of `data` continued from `crc` (0 to start); hardware on x86-64 with
// SSE4.2.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace k3
