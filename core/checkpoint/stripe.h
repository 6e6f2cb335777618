// Striped copies of the routed experts over several directories, one per drive (`k3 stripe`):
// every MoE layer's experts are spread over every directory in proportion to a weight per
// directory (its drive's read rate), so that one layer's expert reads keep every drive busy.
// Each directory gets one data file holding its experts' bytes, each at an offset with the same
// remainder modulo 4096 as in its shard (an O_DIRECT read of it needs the same blocks), and a
// manifest (k3-stripe.json) with the checkpoint's config fingerprint and, per source shard, the
// extents it holds with a CRC-32C each. The stripes are copies: the shards stay as they are, and
// a reader may take each expert from its shard or from a stripe. Only experts whose six parts
// are one contiguous byte range (as released) are striped; the others are read from the shards
// only. Format: docs/STORAGE.md, "Striped layout".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"

namespace k3 {

inline constexpr char kStripeManifestFile[] = "k3-stripe.json";
inline constexpr char kStripeDataFile[] = "k3-experts.stripe";
inline constexpr char kStripeFormat[] = "k3-stripe";
// 2 added "layout" (slices); version 1 manifests hold whole experts and are still read.
inline constexpr int kStripeVersion = 2;
// An extent's offset in the data file has its source offset's remainder modulo this.
inline constexpr uint64_t kStripeAlignment = 4096;
inline constexpr int kMaxStripeDirectories = 64;

// How a striped layout spreads a layer's experts over the directories.
enum class StripeLayout {
  // Each expert cut into one piece per directory, each piece's length in proportion to the
  // directory's weight (cuts at 4 KiB boundaries of the shard): every read of an expert keeps
  // every drive busy for the same time, whichever experts a token routes to. The default.
  kSlices,
  // Whole experts dealt over the directories by weight: a token's 16 experts of a layer land on
  // the drives unevenly (by chance, about 1.4x the mean on the busiest of three), so a layer
  // waits for its busiest drive. With copies > 1 the reader balances between the copies.
  kExperts,
};

// Which directories hold each routed expert: `copies` distinct ones each, or (kSlices) a piece
// of it in every directory.
struct StripePlan {
  std::vector<double> weights;  // one per directory, as given (positive)
  StripeLayout layout = StripeLayout::kExperts;
  int copies = 1;  // directories per striped expert, in [1, directories()]
  int64_t num_layers = 0;
  int64_t num_experts = 0;
  // [(layer * num_experts + e) * copies + j]: the directory of copy j of the expert (distinct
  // for j in [0, copies)), or -1 where it is not striped (dense layers, and experts whose parts
  // are not one contiguous span: those stay in the shards only). kSlices: 0 for a striped
  // expert (every directory holds a piece of it: SliceOf).
  std::vector<int> dir;
  // [layer][directory]: the striped bytes of the layer on the directory.
  std::vector<std::vector<uint64_t>> layer_bytes;
  int64_t unstriped = 0;  // routed experts of MoE layers left in the shards (not contiguous)

  int directories() const { return static_cast<int>(weights.size()); }
  // The directory of the expert's first copy (-1 when not striped).
  int DirOf(int64_t layer, int64_t e) const { return dir[(layer * num_experts + e) * copies]; }
  // The directories of all its copies (all -1 when not striped).
  std::vector<int> DirsOf(int64_t layer, int64_t e) const;
  // Whether directory d holds the expert, or (kSlices) a piece of it that may be empty.
  bool Holds(int d, int64_t layer, int64_t e) const;
  int64_t StripedExperts() const;  // experts with copies, each counted once
  uint64_t DirectoryBytes(int d) const;
  uint64_t TotalBytes() const;  // all copies
};

// Assigns every contiguous routed expert to one of weights.size() directories, layer by layer:
// the directory's count of the layer's experts is its weighted share rounded by largest
// remainder (ties rotating with the layer, so no directory takes every rounding), and at least
// one expert when the layer has as many as there are directories; the experts are then dealt
// in id order by a smooth weighted round-robin with those counts, so consecutive ids alternate
// directories (no run of neighbouring experts on one drive) and each directory's share of every
// layer is within one expert of its weight. Deterministic. InvalidArgument for no weights, more
// than kMaxStripeDirectories, or a weight that is not a positive finite number.
//
// With copies = K > 1 each expert goes to K distinct directories. The first copies are placed
// as above; a directory's total count of the layer's experts is then K x its weighted share,
// capped at every expert (what a capped directory cannot take goes to the others by weight),
// within one expert; the other K - 1 copies are dealt in id order by a second smooth weighted
// round-robin with the remaining counts, skipping the directories that already hold the expert
// (and taking a directory first when it needs every expert left to reach its count), so the
// experts any two directories share are spread over the ids. InvalidArgument for K outside
// [1, weights.size()].
//
// With kSlices (copies must be 1) every contiguous expert is cut into pieces by SliceOf.
absl::StatusOr<StripePlan> PlanStripes(const Checkpoint& ckpt, std::vector<double> weights,
                                       int copies = 1,
                                       StripeLayout layout = StripeLayout::kExperts);

// Directory d's piece of an expert's span in a sliced layout: the span cut at the multiples of
// kStripeAlignment of the shard nearest to its weighted cumulative shares, so that each piece
// starts at a 4 KiB boundary (but the first) and is its weight's share within 4 KiB. May be
// empty (length 0) for a tiny expert or weight.
ByteSpan SliceOf(const ByteSpan& span, const std::vector<double>& weights, int d);

// "slices" or "experts", and back (InvalidArgument naming the text).
std::string_view StripeLayoutName(StripeLayout layout);
absl::StatusOr<StripeLayout> ParseStripeLayout(std::string_view text);

// One directory's share of a plan against its weight.
// With K copies the shares are of one copy of the striped experts: they add up to K.
struct StripeShare {
  double weight_share = 0;  // its weight / the sum of the weights
  double target = 0;        // K x weight_share, capped at 1 (the excess to the others by weight)
  uint64_t bytes = 0;       // striped bytes on it, all layers
  double share = 0;         // bytes / the striped experts' bytes (one copy each)
  // Its share of each MoE layer's striped experts' bytes: the least and the most, and where.
  double min_layer_share = 0;
  double max_layer_share = 0;
  int64_t min_layer = -1;
  int64_t max_layer = -1;
  int64_t layers_without = 0;  // layers with striped experts of which it holds none
};
std::vector<StripeShare> StripeShares(const StripePlan& plan);

struct StripeOptions {
  // Bytes done of the current phase of total: "stripe" (copying), then "verify" (re-reading the
  // data files). Called from one thread at a time, not necessarily the caller's.
  std::function<void(std::string_view phase, uint64_t done, uint64_t total)> progress;
  bool verify = true;
};

// Writes the plan's stripes: in dirs[d] (created if missing) the data file kStripeDataFile with
// the experts of directory d in shard and offset order, then the manifest. A stale manifest is
// removed first; the data file goes to a .partial file renamed when complete and fsynced; the
// directories are written in parallel (one thread each, each file sequentially), read back and
// checked against the CRC-32C of the bytes copied (when options.verify), and only then does each
// get its manifest (temp file, fsync, rename). On failure no directory is left with a manifest,
// and data files written by this call are removed. InvalidArgument when dirs do not match the
// plan (count, a directory named twice) or the plan is of another checkpoint's shape.
absl::Status WriteStripes(const Checkpoint& ckpt, const StripePlan& plan,
                          const std::vector<std::string>& dirs, const StripeOptions& options = {});

// One striped copy of an expert's bytes.
struct StripeExtent {
  std::string shard;    // source shard basename
  uint64_t offset = 0;  // in the source shard
  uint64_t length = 0;
  std::string path;  // stripe data file, full path
  uint64_t at = 0;   // offset in the data file; at % 4096 == offset % 4096
  uint32_t crc = 0;  // CRC-32C of the bytes
  int64_t layer = 0;
  int64_t expert = 0;
};

// The extents of every directory of `dirs` that holds a manifest (others are ignored: they may
// hold plain copies instead), ordered by shard, offset and then the order of dirs; an expert is
// listed once per directory that holds it. Each manifest is checked against the checkpoint: its
// fingerprint (InvalidArgument naming the manifest for another model), its shards (basename and
// size) and each extent (the span of that expert in that shard, at the same offset modulo 4096,
// inside the data file, none overlapping); the data file must exist with the recorded size
// (NotFound, DataLoss when shorter). Then a deterministic sample, the first, middle and last
// extent of each data file, is read (O_DIRECT where the file system allows) and its CRC-32C
// compared with the manifest's (DataLoss naming the data file and the offset) and with the
// source bytes' (InvalidArgument: striped from another checkpoint of the same config). A
// directory listed twice is InvalidArgument.
absl::StatusOr<std::vector<StripeExtent>> LoadStripes(const Checkpoint& ckpt,
                                                      const std::vector<std::string>& dirs);

// LoadStripes, then every extent's bytes read and checked against its CRC-32C (DataLoss naming
// the data file and the offset). `progress(done, total)` reports bytes of the extents.
absl::Status VerifyStripes(const Checkpoint& ckpt, const std::vector<std::string>& dirs,
                           const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace k3
