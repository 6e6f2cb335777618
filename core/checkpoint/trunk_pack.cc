#include "core/checkpoint/trunk_pack.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/problem_list.h"
#include "core/util/progress.h"
#include "core/checkpoint/tensor_names.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/checkpoint/trunk_manifest.h"
#include "io/aligned_buffer.h"
#include "io/file.h"

namespace k3 {
namespace {

// Reads and compares in pieces of this size: large enough for sequential throughput, small
// enough that a 2 GB embedding never needs a 2 GB buffer.
constexpr uint64_t kChunkBytes = 4 << 20;

// ---- CRC-32C ------------------------------------------------------------------------------

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    table[i] = c;
  }
  return table;
}

uint32_t Crc32cPortable(uint32_t crc, const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> kTable = MakeCrcTable();
  for (; n > 0; --n, ++p) crc = kTable[(crc ^ *p) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}
#endif

// ---- Layout -------------------------------------------------------------------------------

// Runs in file order (globals first, then layers in order), tensors in TrunkTensorSpecs order.
// Offsets are assigned while writing (WriteRuns): a compressed tensor's size is known only
// once it is encoded.
std::vector<PackedRun> PlanLayout(const Checkpoint& ckpt, bool compress) {
  std::map<int64_t, PackedRun> by_layer;  // -1 sorts first
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
    const TensorInfo* t = ckpt.Find(spec.name);
    PackedTensor p;
    p.name = t->name;
    p.dtype = t->dtype;
    p.shape = t->shape;
    p.length = p.stored = t->byte_size;
    if (compress && IsCompressible(*t, spec.group == TensorGroup::kEmbedding)) p.codec = kBf16Codec;
    PackedRun& run = by_layer[spec.layer];
    run.layer = spec.layer;
    run.tensors.push_back(std::move(p));
  }
  std::vector<PackedRun> runs;
  for (auto& [layer, run] : by_layer) runs.push_back(std::move(run));
  return runs;
}

// ---- Checks against the checkpoint --------------------------------------------------------

void CompareTensor(const TensorSpec& spec, const TensorInfo& info, const PackedRun& run,
                   const PackedTensor& t, ProblemList& problems) {
  if (run.layer != spec.layer) {
    problems.Add(absl::StrCat("tensor ", t.name, " is in the run of ", LayerText(run.layer),
                              ", not ", LayerText(spec.layer)));
  }
  if (t.dtype != info.dtype) {
    problems.Add(absl::StrCat("tensor ", t.name, ": dtype ", DTypeName(t.dtype),
                              ", the checkpoint has ", DTypeName(info.dtype)));
  }
  if (t.shape != info.shape) {
    problems.Add(absl::StrCat("tensor ", t.name, ": shape ", ShapeText(t.shape),
                              ", the checkpoint has ", ShapeText(info.shape)));
  }
  if (t.length != info.byte_size) {
    problems.Add(absl::StrCat("tensor ", t.name, ": length ", t.length, ", the checkpoint has ",
                              info.byte_size));
  }
}

absl::Status CheckPackFileSize(const std::string& manifest, const std::string& pack_path,
                               uint64_t pack_bytes) {
  if (!io::FileExists(pack_path)) {
    return absl::NotFoundError(
        absl::StrCat(manifest, ": pack_file ", pack_path, " does not exist"));
  }
  auto file = io::RandomAccessFile::Open(pack_path);
  if (!file.ok()) return file.status();
  const uint64_t size = (*file)->size();
  if (size < pack_bytes) {
    return absl::DataLossError(absl::StrCat(pack_path, " is ", size, " bytes, shorter than the ",
                                            pack_bytes, " that ", manifest,
                                            " records in pack_bytes (truncated?)"));
  }
  if (size > pack_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(pack_path, " is ", size, " bytes, but ",
                                                   manifest, " records pack_bytes ", pack_bytes));
  }
  return absl::OkStatus();
}

// ---- Copying and comparing ----------------------------------------------------------------

// Streams one tensor from its shard straight into the writer's buffers, hashing on the way.
absl::Status CopyTensor(const Checkpoint& ckpt, const TensorInfo& info, io::SequentialWriter& w,
                        PackedTensor& out, const std::function<void(uint64_t)>& advanced) {
  uint32_t crc = 0;
  for (uint64_t done = 0; done < info.byte_size;) {
    std::span<uint8_t> dst = w.Reserve(std::min(info.byte_size - done, kChunkBytes));
    absl::Status s = ckpt.ReadSpan({info.shard, info.file_offset + done, dst.size()}, dst);
    if (!s.ok()) return s;
    crc = Crc32c(crc, dst.data(), dst.size());
    done += dst.size();
    if (s = w.Advance(dst.size()); !s.ok()) return s;
    advanced(dst.size());
  }
  out.hash = crc;
  return absl::OkStatus();
}

// Writes the runs, assigning offsets: each run at a multiple of kRunAlignment, verbatim tensors
// at multiples of kTensorAlignment inside it, compressed ones block by block.
absl::Status WriteRuns(const Checkpoint& ckpt, std::vector<PackedRun>& runs, uint64_t block_bytes,
                       io::SequentialWriter& w, ProgressBar& bar) {
  uint64_t done = 0;
  auto advanced = [&](uint64_t n) { bar.Update(done += n); };
  for (PackedRun& run : runs) {
    run.offset = io::AlignUpTo(w.bytes_written(), kRunAlignment);
    if (absl::Status s = PadTo(w, run.offset); !s.ok()) return s;
    for (PackedTensor& t : run.tensors) {
      const TensorInfo& info = *ckpt.Find(t.name);
      absl::Status s;
      if (!t.codec.empty()) {
        s = WriteCompressedTensor(ckpt, info, block_bytes, w, t, advanced);
      } else {
        t.offset = io::AlignUpTo(w.bytes_written(), kTensorAlignment);
        s = PadTo(w, t.offset);
        if (s.ok()) s = CopyTensor(ckpt, info, w, t, advanced);
      }
      if (!s.ok()) return s;
    }
    const uint64_t end = io::AlignUpTo(std::max(w.bytes_written(), run.offset + 1), kRunAlignment);
    if (absl::Status s = PadTo(w, end); !s.ok()) return s;
    run.length = end - run.offset;
  }
  bar.Finish();
  return absl::OkStatus();
}

uint64_t FirstDifference(const uint8_t* a, const uint8_t* b, uint64_t n) {
  uint64_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

absl::Status VerifyTensor(const Checkpoint& ckpt, const io::RandomAccessFile& pack,
                          const PackedTensor& t, std::vector<uint8_t>& a, std::vector<uint8_t>& b,
                          const std::function<void(uint64_t)>& advanced) {
  const TensorInfo* info = ckpt.Find(t.name);
  if (info == nullptr || info->byte_size != t.length) {
    return absl::FailedPreconditionError(
        absl::StrCat(pack.path(), ": tensor ", t.name, " does not match the checkpoint"));
  }
  uint32_t crc = 0;
  for (uint64_t done = 0; done < t.length;) {
    const uint64_t n = std::min(t.length - done, kChunkBytes);
    absl::Status s = pack.ReadAt(t.offset + done, {a.data(), n});
    if (s.ok()) s = ckpt.ReadSpan({info->shard, info->file_offset + done, n}, {b.data(), n});
    if (!s.ok()) return s;
    if (std::memcmp(a.data(), b.data(), n) != 0) {
      const uint64_t at = done + FirstDifference(a.data(), b.data(), n);
      return absl::DataLossError(
          absl::StrCat("tensor ", t.name, " differs from the checkpoint at byte ", at,
                       " of the tensor (offset ", t.offset + at, " of ", pack.path(), ")"));
    }
    crc = Crc32c(crc, a.data(), n);
    done += n;
    advanced(n);
  }
  if (crc != t.hash) {
    return absl::DataLossError(absl::StrCat("tensor ", t.name, " at offset ", t.offset, " of ",
                                            pack.path(), ": CRC-32C ", crc,
                                            " differs from the manifest's ", t.hash));
  }
  return absl::OkStatus();
}

// Removes a file if it exists; an error names it.
absl::Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("removing ", path, ": ", std::strerror(errno)));
}

absl::Status WriteManifest(const std::string& path, const std::string& text) {
  auto w = io::SequentialWriter::Create(path);
  if (!w.ok()) return w.status();
  absl::Status s = (*w)->Append({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  if (s.ok()) s = (*w)->Commit();
  return s;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The steps after trunk.pack is in place: round-trip the manifest through the parser and the
// checkpoint checks, verify, and only then publish the manifest.
absl::Status CheckVerifyPublish(const Checkpoint& ckpt, const std::string& manifest_path,
                                const std::string& text, const PackOptions& options) {
  auto pack = TrunkPack::ParseManifest(text, manifest_path);
  if (!pack.ok()) return pack.status();
  if (absl::Status s = (*pack)->CheckAgainst(ckpt); !s.ok()) return s;
  if (options.verify) {
    ProgressBar bar("verify", (*pack)->tensor_bytes(), "B", options.show_progress);
    absl::Status s = VerifyTrunkPack(ckpt, **pack, [&](uint64_t d, uint64_t) { bar.Update(d); });
    if (!s.ok()) return s;
    bar.Finish();
  }
  return WriteManifest(manifest_path, text);
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__x86_64__)
  static const bool kHardware = __builtin_cpu_supports("sse4.2");
  if (kHardware) return ~Crc32cSse42(~crc, p, size);
#endif
  return ~Crc32cPortable(~crc, p, size);
}

// ---- TrunkPack ----------------------------------------------------------------------------

absl::Status TrunkPack::CheckAgainst(const Checkpoint& ckpt) const {
  const std::string expected = ckpt.config().Fingerprint();
  if (fingerprint_ != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        manifest_path_, ": fingerprint ", fingerprint_, " does not match the config of ",
        ckpt.dir(), " (", expected, "): the pack was made from another model; re-run k3 pack"));
  }
  ProblemList problems(10);
  absl::flat_hash_set<std::string> trunk;
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
    trunk.insert(spec.name);
    const PackedTensor* t = Find(spec.name);
    const TensorInfo* info = ckpt.Find(spec.name);
    if (t == nullptr) {
      problems.Add(absl::StrCat("tensor ", spec.name, " is missing"));
    } else if (info != nullptr) {
      CompareTensor(spec, *info, runs_[by_name_.at(spec.name).first], *t, problems);
    }
  }
  for (const PackedRun& run : runs_) {
    for (const PackedTensor& t : run.tensors) {
      if (!trunk.contains(t.name)) {
        problems.Add(absl::StrCat("tensor ", t.name, " is not a trunk tensor of the checkpoint"));
      }
    }
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        manifest_path_, ": does not match the checkpoint ", ckpt.dir(), " ", problems.Text()));
  }
  return CheckPackFileSize(manifest_path_, pack_path_, pack_bytes_);
}

absl::StatusOr<std::unique_ptr<TrunkPack>> TrunkPack::Open(const std::string& dir,
                                                           const Checkpoint& ckpt) {
  const std::string manifest = io::JoinPath(dir, kTrunkManifestFile);
  if (!io::FileExists(manifest)) {
    const std::string partial = io::JoinPath(dir, absl::StrCat(kTrunkPackFile, ".partial"));
    return absl::NotFoundError(absl::StrCat(
        dir, " holds no trunk pack (", kTrunkManifestFile, " not found)",
        io::FileExists(partial)
            ? absl::StrCat("; ", partial, " is left from an interrupted k3 pack: run it again")
            : std::string()));
  }
  auto text = io::ReadFileToString(manifest);
  if (!text.ok()) return text.status();
  auto pack = ParseManifest(*text, manifest);
  if (!pack.ok()) return pack.status();
  if (absl::Status s = (*pack)->CheckAgainst(ckpt); !s.ok()) return s;
  return pack;
}

uint64_t TrunkPack::stored_tensor_bytes() const {
  uint64_t total = 0;
  for (const PackedRun& run : runs_) {
    for (const PackedTensor& t : run.tensors) total += t.stored;
  }
  return total;
}

uint64_t TrunkPack::tensor_bytes() const {
  uint64_t total = 0;
  for (const PackedRun& run : runs_) {
    for (const PackedTensor& t : run.tensors) total += t.length;
  }
  return total;
}

const std::vector<std::string>& PackCodecNames() {
  static const std::vector<std::string> kNames = {kBf16Codec};
  return kNames;
}

bool IsPackCodec(const std::string& name) {
  const auto& names = PackCodecNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

const PackedRun* TrunkPack::layer_run(int64_t layer) const {
  auto it = by_layer_.find(layer);
  return it == by_layer_.end() ? nullptr : &runs_[it->second];
}

const PackedTensor* TrunkPack::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &runs_[it->second.first].tensors[it->second.second];
}

// ---- Writing and verifying ----------------------------------------------------------------

absl::StatusOr<PackResult> WriteTrunkPack(const Checkpoint& ckpt, const std::string& out_dir,
                                          const PackOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (!options.codec.empty() && !IsPackCodec(options.codec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--codec ", options.codec, ": unknown codec (one of: ", PackCodecNames().front(), ")"));
  }
  if (absl::Status s = io::MakeDirectories(out_dir); !s.ok()) return s;
  const std::string pack_path = io::JoinPath(out_dir, kTrunkPackFile);
  const std::string manifest_path = io::JoinPath(out_dir, kTrunkManifestFile);
  // Without its manifest an old pack is inert, whatever happens to trunk.pack from here on.
  if (absl::Status s = RemoveIfExists(manifest_path); !s.ok()) return s;

  const auto& codecs = PackCodecNames();
  if (!options.codec.empty() &&
      std::find(codecs.begin(), codecs.end(), options.codec) == codecs.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--codec ", options.codec, ": unknown codec (known: ", codecs.front(), ")"));
  }
  std::vector<PackedRun> runs = PlanLayout(ckpt, !options.codec.empty());
  uint64_t source_bytes = 0;
  for (const PackedRun& run : runs) {
    for (const PackedTensor& t : run.tensors) source_bytes += t.length;
  }
  {
    auto writer = io::SequentialWriter::Create(pack_path);
    if (!writer.ok()) return writer.status();
    ProgressBar bar("pack", source_bytes, "B", options.show_progress);
    absl::Status s = WriteRuns(ckpt, runs, options.block_bytes, **writer, bar);
    if (s.ok()) s = (*writer)->Commit();
    if (!s.ok()) return s;  // the writer deletes trunk.pack.partial
  }
  const uint64_t pack_bytes = runs.back().offset + runs.back().length;
  const std::string text = ManifestText(ckpt.config(), runs, pack_bytes, options.codec);
  if (absl::Status s = CheckVerifyPublish(ckpt, manifest_path, text, options); !s.ok()) {
    RemoveIfExists(pack_path).IgnoreError();  // the original error matters more
    return s;
  }
  PackResult result;
  result.bytes = pack_bytes;
  result.tensor_bytes = source_bytes;
  for (const PackedRun& run : runs) result.tensors += static_cast<int64_t>(run.tensors.size());
  result.seconds = SecondsSince(start);
  return result;
}

absl::Status VerifyTrunkPack(const Checkpoint& ckpt, const TrunkPack& pack,
                             const std::function<void(uint64_t, uint64_t)>& progress) {
  auto file = io::RandomAccessFile::Open(pack.pack_path());
  if (!file.ok()) return file.status();
  const uint64_t total = pack.tensor_bytes();
  uint64_t done = 0;
  auto advanced = [&](uint64_t n) {
    done += n;
    if (progress) progress(done, total);
  };
  std::vector<uint8_t> a(kChunkBytes), b(kChunkBytes);
  for (const PackedRun& run : pack.runs()) {
    for (const PackedTensor& t : run.tensors) {
      absl::Status s = t.compressed() ? VerifyCompressedTensor(ckpt, **file, t, advanced)
                                      : VerifyTensor(ckpt, **file, t, a, b, advanced);
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace k3
