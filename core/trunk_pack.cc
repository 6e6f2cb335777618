#include "core/trunk_pack.h"

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
#include "core/progress.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Reads and compares in pieces of this size: large enough for sequential throughput, small
// enough that a 2 GB embedding never needs a 2 GB buffer.
constexpr uint64_t kChunkBytes = 4 << 20;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

std::string JoinPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

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

// Runs in file order (globals first, then layers in order), tensors in TrunkTensorSpecs order,
// offsets assigned; hashes are filled in while copying.
std::vector<PackedRun> PlanLayout(const Checkpoint& ckpt) {
  std::map<int64_t, std::vector<const TensorInfo*>> by_layer;  // -1 sorts first
  for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
    by_layer[spec.layer].push_back(ckpt.Find(spec.name));
  }
  std::vector<PackedRun> runs;
  uint64_t pos = 0;
  for (const auto& [layer, infos] : by_layer) {
    PackedRun run{layer, pos, 0, {}};
    for (const TensorInfo* t : infos) {
      pos = AlignUp(pos, kTensorAlignment);
      run.tensors.push_back({t->name, t->dtype, t->shape, pos, t->byte_size, 0});
      pos += t->byte_size;
    }
    pos = AlignUp(std::max(pos, run.offset + 1), kRunAlignment);
    run.length = pos - run.offset;
    runs.push_back(std::move(run));
  }
  return runs;
}

std::string LayerText(int64_t layer) {
  return layer < 0 ? std::string("globals") : absl::StrCat("layer ", layer);
}

ojson ManifestJson(const ModelConfig& config, const std::vector<PackedRun>& runs,
                   uint64_t pack_bytes) {
  ojson jruns = ojson::array();
  for (const PackedRun& run : runs) {
    ojson tensors = ojson::array();
    for (const PackedTensor& t : run.tensors) {
      tensors.push_back({{"name", t.name},
                         {"dtype", DTypeName(t.dtype)},
                         {"shape", t.shape},
                         {"offset", t.offset},
                         {"length", t.length},
                         {"crc32c", t.hash}});
    }
    ojson layer = run.layer < 0 ? ojson("globals") : ojson(run.layer);
    jruns.push_back({{"layer", layer},
                     {"offset", run.offset},
                     {"length", run.length},
                     {"tensors", std::move(tensors)}});
  }
  return {{"format", kTrunkPackFormat},
          {"version", kTrunkPackVersion},
          {"fingerprint", config.Fingerprint()},
          {"pack_file", kTrunkPackFile},
          {"pack_bytes", pack_bytes},
          {"run_alignment", kRunAlignment},
          {"tensor_alignment", kTensorAlignment},
          {"runs", std::move(jruns)}};
}

// ---- Manifest parsing ---------------------------------------------------------------------

// Reads typed fields; every error starts with the manifest's name and the key's path.
class ManifestReader {
 public:
  explicit ManifestReader(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const std::string& where, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", where, ": ", what));
  }

  absl::StatusOr<const json*> Field(const json& obj, const char* key,
                                    const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end()) return Error(Key(where, key), "missing");
    return &*it;
  }

  absl::StatusOr<uint64_t> U64(const json& obj, const char* key, const std::string& where) const {
    auto f = Field(obj, key, where);
    if (!f.ok()) return f.status();
    if (!(*f)->is_number_unsigned()) {
      return Error(Key(where, key),
                   absl::StrCat("must be a non-negative integer, not ", (*f)->dump()));
    }
    return (*f)->get<uint64_t>();
  }

  absl::StatusOr<std::string> String(const json& obj, const char* key,
                                     const std::string& where) const {
    auto f = Field(obj, key, where);
    if (!f.ok()) return f.status();
    if (!(*f)->is_string() || (*f)->get<std::string>().empty()) {
      return Error(Key(where, key), "must be a non-empty string");
    }
    return (*f)->get<std::string>();
  }

  absl::StatusOr<const json*> Array(const json& obj, const char* key,
                                    const std::string& where) const {
    auto f = Field(obj, key, where);
    if (f.ok() && !(*f)->is_array()) return Error(Key(where, key), "must be an array");
    return f;
  }

  static std::string Key(const std::string& where, const char* key) {
    return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
  }

 private:
  std::string source_;
};

absl::StatusOr<DType> ParseDType(const std::string& name) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32, DType::kU8}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const json& j) {
  if (!j.is_array()) return absl::InvalidArgumentError("must be an array of sizes");
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) {
      return absl::InvalidArgumentError(absl::StrCat("size ", d.dump(), " is not a valid size"));
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// Bytes a tensor of this dtype and shape holds, or 0 on overflow (sizes are bounded above).
uint64_t ShapeBytes(DType dtype, const std::vector<int64_t>& shape) {
  unsigned __int128 n = DTypeSize(dtype);
  for (int64_t d : shape) {
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 62)) return 0;
  }
  return static_cast<uint64_t>(n);
}

absl::StatusOr<PackedTensor> ParseTensor(const ManifestReader& r, const json& j,
                                         const std::string& where) {
  if (!j.is_object()) return r.Error(where, "must be an object");
  PackedTensor t;
  auto name = r.String(j, "name", where);
  if (!name.ok()) return name.status();
  t.name = *name;
  const std::string at = absl::StrCat(where, " (", t.name, ")");
  auto dtype = r.String(j, "dtype", at);
  if (!dtype.ok()) return dtype.status();
  auto d = ParseDType(*dtype);
  if (!d.ok()) return r.Error(at + ".dtype", std::string(d.status().message()));
  t.dtype = *d;
  auto shape_field = r.Field(j, "shape", at);
  if (!shape_field.ok()) return shape_field.status();
  auto shape = ParseShape(**shape_field);
  if (!shape.ok()) return r.Error(at + ".shape", std::string(shape.status().message()));
  t.shape = *std::move(shape);
  auto offset = r.U64(j, "offset", at);
  auto length = r.U64(j, "length", at);
  auto crc = r.U64(j, "crc32c", at);
  for (const auto* s : {&offset, &length, &crc}) {
    if (!s->ok()) return s->status();
  }
  t.offset = *offset;
  t.length = *length;
  t.hash = *crc;
  if (t.hash > 0xffffffffu) return r.Error(at + ".crc32c", "is not a 32-bit CRC");
  if (t.length != ShapeBytes(t.dtype, t.shape)) {
    return r.Error(at + ".length", absl::StrCat(t.length, " bytes do not match dtype ", *dtype,
                                                " and shape ", (*shape_field)->dump()));
  }
  if (t.offset % kTensorAlignment != 0) {
    return r.Error(at + ".offset",
                   absl::StrCat(t.offset, " is not a multiple of ", kTensorAlignment));
  }
  return t;
}

absl::StatusOr<int64_t> ParseLayer(const ManifestReader& r, const json& run,
                                   const std::string& where) {
  auto f = r.Field(run, "layer", where);
  if (!f.ok()) return f.status();
  if ((*f)->is_string() && (*f)->get<std::string>() == "globals") return -1;
  if (!(*f)->is_number_unsigned() || (*f)->get<uint64_t>() > (1u << 20)) {
    return r.Error(where + ".layer",
                   absl::StrCat("must be a layer number or \"globals\", not ", (*f)->dump()));
  }
  return (*f)->get<int64_t>();
}

// The run's own fields and that it lies inside the pack; then its tensors inside it.
absl::StatusOr<PackedRun> ParseRun(const ManifestReader& r, const json& j, size_t index,
                                   uint64_t pack_bytes) {
  std::string where = absl::StrCat("runs[", index, "]");
  if (!j.is_object()) return r.Error(where, "must be an object");
  PackedRun run;
  auto layer = ParseLayer(r, j, where);
  if (!layer.ok()) return layer.status();
  run.layer = *layer;
  where = absl::StrCat(where, " (", LayerText(run.layer), ")");
  auto offset = r.U64(j, "offset", where);
  if (!offset.ok()) return offset.status();
  auto length = r.U64(j, "length", where);
  if (!length.ok()) return length.status();
  run.offset = *offset;
  run.length = *length;
  if (run.offset % kRunAlignment != 0 || run.length % kRunAlignment != 0 || run.length == 0) {
    return r.Error(where, absl::StrCat("offset ", run.offset, " and length ", run.length,
                                       " must be non-zero multiples of ", kRunAlignment));
  }
  if (run.offset > pack_bytes || run.length > pack_bytes - run.offset) {
    return r.Error(where, absl::StrCat("ends at byte ", run.offset + run.length,
                                       ", past the end of the pack (pack_bytes ", pack_bytes, ")"));
  }
  auto tensors = r.Array(j, "tensors", where);
  if (!tensors.ok()) return tensors.status();
  uint64_t end = run.offset;  // tensors in increasing offset order, not overlapping
  for (size_t i = 0; i < (*tensors)->size(); ++i) {
    const std::string at = absl::StrCat(where, ".tensors[", i, "]");
    auto t = ParseTensor(r, (**tensors)[i], at);
    if (!t.ok()) return t.status();
    if (t->offset < end || t->length > run.offset + run.length - t->offset) {
      return r.Error(at + " (" + t->name + ")",
                     absl::StrCat("bytes [", t->offset, ", ", t->offset + t->length,
                                  ") overlap the previous tensor or leave the run [", run.offset,
                                  ", ", run.offset + run.length, ")"));
    }
    end = t->offset + t->length;
    run.tensors.push_back(*std::move(t));
  }
  return run;
}

absl::Status CheckRunsDisjoint(const ManifestReader& r, const std::vector<PackedRun>& runs) {
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return runs[a].offset < runs[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const PackedRun& prev = runs[order[k - 1]];
    const PackedRun& cur = runs[order[k]];
    if (cur.offset < prev.offset + prev.length) {
      return r.Error(absl::StrCat("runs[", order[k], "] (", LayerText(cur.layer), ")"),
                     absl::StrCat("bytes [", cur.offset, ", ", cur.offset + cur.length,
                                  ") overlap runs[", order[k - 1], "] (", LayerText(prev.layer),
                                  ") at [", prev.offset, ", ", prev.offset + prev.length, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckHeader(const ManifestReader& r, const json& root) {
  auto format = r.String(root, "format", "");
  if (!format.ok()) return format.status();
  if (*format != kTrunkPackFormat) {
    return r.Error("format", absl::StrCat("\"", *format, "\" is not \"", kTrunkPackFormat, "\""));
  }
  auto version = r.U64(root, "version", "");
  if (!version.ok()) return version.status();
  if (*version != kTrunkPackVersion) {
    return r.Error("version", absl::StrCat(*version, " is not supported (this k3 reads version ",
                                           kTrunkPackVersion, "; re-run k3 pack)"));
  }
  return absl::OkStatus();
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// ---- Checks against the checkpoint --------------------------------------------------------

// Collects mismatches so that one message lists the first few.
class Problems {
 public:
  void Add(std::string what) {
    if (items_.size() < 10) items_.push_back(std::move(what));
    ++count_;
  }
  absl::Status ToStatus(const std::string& source, const std::string& dir) const {
    if (count_ == 0) return absl::OkStatus();
    std::string more =
        count_ > items_.size() ? absl::StrCat("; and ", count_ - items_.size(), " more") : "";
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": does not match the checkpoint ", dir, " (", count_,
                     " problems): ", absl::StrJoin(items_, "; "), more));
  }

 private:
  std::vector<std::string> items_;
  size_t count_ = 0;
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

void CompareTensor(const TensorSpec& spec, const TensorInfo& info, const PackedRun& run,
                   const PackedTensor& t, Problems& problems) {
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

absl::Status WriteZeros(io::SequentialWriter& w, uint64_t n) {
  while (n > 0) {
    std::span<uint8_t> dst = w.Reserve(n);
    std::memset(dst.data(), 0, dst.size());
    n -= dst.size();
    if (absl::Status s = w.Advance(dst.size()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

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

absl::Status WriteRuns(const Checkpoint& ckpt, std::vector<PackedRun>& runs,
                       io::SequentialWriter& w, ProgressBar& bar) {
  uint64_t done = 0;
  auto advanced = [&](uint64_t n) { bar.Update(done += n); };
  for (PackedRun& run : runs) {
    for (PackedTensor& t : run.tensors) {
      absl::Status s = WriteZeros(w, t.offset - w.bytes_written());
      if (s.ok()) s = CopyTensor(ckpt, *ckpt.Find(t.name), w, t, advanced);
      if (!s.ok()) return s;
    }
    if (absl::Status s = WriteZeros(w, run.offset + run.length - w.bytes_written()); !s.ok()) {
      return s;
    }
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

uint64_t TensorBytes(const TrunkPack& pack) {
  uint64_t total = 0;
  for (const PackedRun& run : pack.runs()) {
    for (const PackedTensor& t : run.tensors) total += t.length;
  }
  return total;
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
    ProgressBar bar("verify", TensorBytes(**pack), "B", options.show_progress);
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

absl::StatusOr<std::unique_ptr<TrunkPack>> TrunkPack::ParseManifest(
    std::string_view text, const std::string& source_name) {
  const ManifestReader r(source_name);
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": not a JSON object"));
  }
  if (absl::Status s = CheckHeader(r, root); !s.ok()) return s;
  std::unique_ptr<TrunkPack> pack(new TrunkPack());
  pack->manifest_path_ = source_name;
  auto fingerprint = r.String(root, "fingerprint", "");
  auto pack_file = r.String(root, "pack_file", "");
  auto pack_bytes = r.U64(root, "pack_bytes", "");
  auto runs = r.Array(root, "runs", "");
  if (!fingerprint.ok()) return fingerprint.status();
  if (!pack_file.ok()) return pack_file.status();
  if (!pack_bytes.ok()) return pack_bytes.status();
  if (!runs.ok()) return runs.status();
  if (pack_file->find('/') != std::string::npos || *pack_file == "." || *pack_file == "..") {
    return r.Error("pack_file",
                   absl::StrCat("\"", *pack_file, "\" is not a file name beside the manifest"));
  }
  pack->fingerprint_ = *fingerprint;
  pack->pack_path_ = JoinPath(DirName(source_name), *pack_file);
  pack->pack_bytes_ = *pack_bytes;
  for (size_t i = 0; i < (*runs)->size(); ++i) {
    auto run = ParseRun(r, (**runs)[i], i, pack->pack_bytes_);
    if (!run.ok()) return run.status();
    pack->runs_.push_back(*std::move(run));
  }
  if (absl::Status s = CheckRunsDisjoint(r, pack->runs_); !s.ok()) return s;
  if (absl::Status s = pack->Index(); !s.ok()) return s;
  return pack;
}

// Sorts runs into file order and indexes layers and names; duplicates are errors.
absl::Status TrunkPack::Index() {
  std::stable_sort(runs_.begin(), runs_.end(),
                   [](const PackedRun& a, const PackedRun& b) { return a.offset < b.offset; });
  const ManifestReader r(manifest_path_);
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (!by_layer_.emplace(runs_[i].layer, i).second) {
      return r.Error("runs", absl::StrCat(LayerText(runs_[i].layer), " has two runs"));
    }
    for (size_t k = 0; k < runs_[i].tensors.size(); ++k) {
      if (!by_name_.emplace(runs_[i].tensors[k].name, std::make_pair(i, k)).second) {
        return r.Error("runs",
                       absl::StrCat("tensor ", runs_[i].tensors[k].name, " is listed twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status TrunkPack::CheckAgainst(const Checkpoint& ckpt) const {
  const std::string expected = ckpt.config().Fingerprint();
  if (fingerprint_ != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        manifest_path_, ": fingerprint ", fingerprint_, " does not match the config of ",
        ckpt.dir(), " (", expected, "): the pack was made from another model; re-run k3 pack"));
  }
  Problems problems;
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
  if (absl::Status s = problems.ToStatus(manifest_path_, ckpt.dir()); !s.ok()) return s;
  return CheckPackFileSize(manifest_path_, pack_path_, pack_bytes_);
}

absl::StatusOr<std::unique_ptr<TrunkPack>> TrunkPack::Open(const std::string& dir,
                                                           const Checkpoint& ckpt) {
  const std::string manifest = JoinPath(dir, kTrunkManifestFile);
  if (!io::FileExists(manifest)) {
    const std::string partial = JoinPath(dir, absl::StrCat(kTrunkPackFile, ".partial"));
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
  if (absl::Status s = io::MakeDirectories(out_dir); !s.ok()) return s;
  const std::string pack_path = JoinPath(out_dir, kTrunkPackFile);
  const std::string manifest_path = JoinPath(out_dir, kTrunkManifestFile);
  // Without its manifest an old pack is inert, whatever happens to trunk.pack from here on.
  if (absl::Status s = RemoveIfExists(manifest_path); !s.ok()) return s;

  std::vector<PackedRun> runs = PlanLayout(ckpt);
  const uint64_t pack_bytes = runs.back().offset + runs.back().length;
  {
    auto writer = io::SequentialWriter::Create(pack_path);
    if (!writer.ok()) return writer.status();
    ProgressBar bar("pack", pack_bytes, "B", options.show_progress);
    absl::Status s = WriteRuns(ckpt, runs, **writer, bar);
    if (s.ok()) s = (*writer)->Commit();
    if (!s.ok()) return s;  // the writer deletes trunk.pack.partial
  }
  const std::string text = ManifestJson(ckpt.config(), runs, pack_bytes).dump(1);
  if (absl::Status s = CheckVerifyPublish(ckpt, manifest_path, text, options); !s.ok()) {
    RemoveIfExists(pack_path).IgnoreError();  // the original error matters more
    return s;
  }
  PackResult result;
  result.bytes = pack_bytes;
  for (const PackedRun& run : runs) result.tensors += static_cast<int64_t>(run.tensors.size());
  result.seconds = SecondsSince(start);
  return result;
}

absl::Status VerifyTrunkPack(const Checkpoint& ckpt, const TrunkPack& pack,
                             const std::function<void(uint64_t, uint64_t)>& progress) {
  auto file = io::RandomAccessFile::Open(pack.pack_path());
  if (!file.ok()) return file.status();
  const uint64_t total = TensorBytes(pack);
  uint64_t done = 0;
  auto advanced = [&](uint64_t n) {
    done += n;
    if (progress) progress(done, total);
  };
  std::vector<uint8_t> a(kChunkBytes), b(kChunkBytes);
  for (const PackedRun& run : pack.runs()) {
    for (const PackedTensor& t : run.tensors) {
      if (absl::Status s = VerifyTensor(ckpt, **file, t, a, b, advanced); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace k3
