#include "core/checkpoint/trunk_manifest.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/manifest_reader.h"
#include "nlohmann/json.hpp"

namespace k3 {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string LayerText(int64_t layer) {
  return layer < 0 ? std::string("globals") : absl::StrCat("layer ", layer);
}

namespace {

ojson TensorJson(const PackedTensor& t) {
  ojson j = {{"name", t.name},     {"dtype", DTypeName(t.dtype)}, {"shape", t.shape},
             {"offset", t.offset}, {"length", t.length},          {"crc32c", t.hash}};
  if (t.compressed()) {
    j["codec"] = t.codec;
    j["stored"] = t.stored;
    ojson blocks = ojson::array();
    for (const PackedBlock& b : t.blocks) blocks.push_back({b.rows, b.offset, b.length, b.hash});
    j["blocks"] = std::move(blocks);
  }
  return j;
}

ojson ManifestJson(const ModelConfig& config, const std::vector<PackedRun>& runs,
                   uint64_t pack_bytes, const std::string& codec) {
  ojson jruns = ojson::array();
  for (const PackedRun& run : runs) {
    ojson tensors = ojson::array();
    for (const PackedTensor& t : run.tensors) tensors.push_back(TensorJson(t));
    ojson layer = run.layer < 0 ? ojson("globals") : ojson(run.layer);
    jruns.push_back({{"layer", layer},
                     {"offset", run.offset},
                     {"length", run.length},
                     {"tensors", std::move(tensors)}});
  }
  ojson root;
  root["format"] = kTrunkPackFormat;
  root["version"] = codec.empty() ? kTrunkPackVersion : kCompressedPackVersion;
  if (!codec.empty()) root["codec"] = {{"name", codec}, {"version", kPackCodecVersion}};
  root["fingerprint"] = config.Fingerprint();
  root["pack_file"] = kTrunkPackFile;
  root["pack_bytes"] = pack_bytes;
  root["run_alignment"] = kRunAlignment;
  root["tensor_alignment"] = kTensorAlignment;
  root["runs"] = std::move(jruns);
  return root;
}

// ---- Manifest parsing ---------------------------------------------------------------------

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

// A compressed tensor's codec, stored size and blocks: rows adding up to the matrix's, each block
// 4 KiB aligned, in order and inside [offset, offset + stored).
absl::Status ParseBlocks(const ManifestReader& r, const json& j, const std::string& at,
                         const std::string& pack_codec, PackedTensor& t) {
  auto codec = r.String(j, "codec", at);
  if (!codec.ok()) return codec.status();
  if (*codec != pack_codec) {
    return r.Error(at + ".codec",
                   absl::StrCat("\"", *codec, "\" is not the pack's codec \"", pack_codec, "\""));
  }
  t.codec = *codec;
  if (t.dtype != DType::kBF16 || t.shape.size() != 2 || t.shape[0] == 0) {
    return r.Error(at, "only BF16 matrices are compressed");
  }
  auto stored = r.U64(j, "stored", at);
  if (!stored.ok()) return stored.status();
  t.stored = *stored;
  auto blocks = r.Array(j, "blocks", at);
  if (!blocks.ok()) return blocks.status();
  uint64_t end = t.offset, rows = 0;
  for (size_t i = 0; i < (*blocks)->size(); ++i) {
    const json& b = (**blocks)[i];
    const std::string here = absl::StrCat(at, ".blocks[", i, "]");
    if (!b.is_array() || b.size() != 4 ||
        !std::all_of(b.begin(), b.end(), [](const json& v) { return v.is_number_unsigned(); })) {
      return r.Error(here, "must be [rows, offset, length, xxh3] of non-negative integers");
    }
    PackedBlock block{b[1].get<uint64_t>(), b[2].get<uint64_t>(), b[0].get<uint64_t>(),
                      b[3].get<uint64_t>()};
    if (block.rows == 0 || block.offset % kRunAlignment != 0 || block.offset < end ||
        block.length > t.offset + t.stored - std::min(block.offset, t.offset + t.stored)) {
      return r.Error(here,
                     absl::StrCat("a block of ", block.rows, " rows at [", block.offset, ", ",
                                  block.offset + block.length, ") must hold rows, start at a ",
                                  "multiple of ", kRunAlignment, " after the previous block",
                                  " and end inside the tensor's stored bytes"));
    }
    end = block.offset + block.length;
    rows += block.rows;
    t.blocks.push_back(block);
  }
  if (t.blocks.empty() || t.blocks.front().offset != t.offset ||
      rows != static_cast<uint64_t>(t.shape[0])) {
    return r.Error(at + ".blocks", absl::StrCat("must start at the tensor's offset and hold its ",
                                                t.shape[0], " rows (they hold ", rows, ")"));
  }
  return absl::OkStatus();
}

// `pack_codec`: "" in a verbatim pack, where no tensor may be compressed.
absl::StatusOr<PackedTensor> ParseTensor(const ManifestReader& r, const json& j,
                                         const std::string& where, const std::string& pack_codec) {
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
  t.stored = t.length;
  if (j.contains("codec") || j.contains("blocks")) {
    if (pack_codec.empty()) return r.Error(at, "is compressed in a pack of version 1");
    if (absl::Status s = ParseBlocks(r, j, at, pack_codec, t); !s.ok()) return s;
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
                                   uint64_t pack_bytes, const std::string& codec) {
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
    auto t = ParseTensor(r, (**tensors)[i], at, codec);
    if (!t.ok()) return t.status();
    if (t->offset < end || t->stored > run.offset + run.length - t->offset) {
      return r.Error(at + " (" + t->name + ")",
                     absl::StrCat("bytes [", t->offset, ", ", t->offset + t->stored,
                                  ") overlap the previous tensor or leave the run [", run.offset,
                                  ", ", run.offset + run.length, ")"));
    }
    end = t->offset + t->stored;
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

// The format and version; for version 2 the codec, which this k3 must know at its version.
// Returns the codec's name ("" for a verbatim pack).
absl::StatusOr<std::string> CheckHeader(const ManifestReader& r, const json& root) {
  auto format = r.String(root, "format", "");
  if (!format.ok()) return format.status();
  if (*format != kTrunkPackFormat) {
    return r.Error("format", absl::StrCat("\"", *format, "\" is not \"", kTrunkPackFormat, "\""));
  }
  auto version = r.U64(root, "version", "");
  if (!version.ok()) return version.status();
  if (*version == kTrunkPackVersion) return std::string();
  if (*version != kCompressedPackVersion) {
    return r.Error("version", absl::StrCat(*version, " is not supported (this k3 reads versions ",
                                           kTrunkPackVersion, " and ", kCompressedPackVersion,
                                           "; re-run k3 pack)"));
  }
  auto codec = r.Field(root, "codec", "");
  if (!codec.ok()) return codec.status();
  if (!(*codec)->is_object()) return r.Error("codec", "must be an object");
  auto name = r.String(**codec, "name", "codec");
  auto codec_version = r.U64(**codec, "version", "codec");
  if (!name.ok()) return name.status();
  if (!codec_version.ok()) return codec_version.status();
  if (!IsPackCodec(*name) || *codec_version != kPackCodecVersion) {
    return r.Error("codec",
                   absl::StrCat("\"", *name, "\" version ", *codec_version,
                                " is not a codec this k3 decodes (", PackCodecNames().front(),
                                " version ", kPackCodecVersion, "); re-run k3 pack"));
  }
  return *name;
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

std::string ManifestText(const ModelConfig& config, const std::vector<PackedRun>& runs,
                         uint64_t pack_bytes, const std::string& codec) {
  return ManifestJson(config, runs, pack_bytes, codec).dump(1);
}

// ---- TrunkPack ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TrunkPack>> TrunkPack::ParseManifest(
    std::string_view text, const std::string& source_name) {
  const ManifestReader r(source_name);
  json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source_name, ": not a JSON object"));
  }
  auto codec = CheckHeader(r, root);
  if (!codec.ok()) return codec.status();
  std::unique_ptr<TrunkPack> pack(new TrunkPack());
  pack->codec_ = *codec;
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
  pack->pack_path_ = io::JoinPath(DirName(source_name), *pack_file);
  pack->pack_bytes_ = *pack_bytes;
  for (size_t i = 0; i < (*runs)->size(); ++i) {
    auto run = ParseRun(r, (**runs)[i], i, pack->pack_bytes_, pack->codec_);
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

}  // namespace k3
