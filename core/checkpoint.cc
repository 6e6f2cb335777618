#include "core/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/numeric.h"
#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using json = nlohmann::json;

constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

std::string JoinPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

// Reads model.safetensors.index.json: the shard file of every tensor name.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  auto text = io::ReadFileToString(path);
  if (!text.ok()) return text.status();
  json root = json::parse(*text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": not a JSON object"));
  }
  auto map = root.find("weight_map");
  if (map == root.end() || !map->is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": no \"weight_map\" object"));
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, ": weight_map entry for ", name,
                                              " is not a file name in the directory"));
    }
    out[name] = file.get<std::string>();
  }
  return out;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Collects missing or mismatched tensors so that one message lists them (up to a limit).
class TensorProblems {
 public:
  void Add(std::string what) {
    if (items_.size() < kShown) items_.push_back(std::move(what));
    ++count_;
  }
  absl::Status ToStatus(const std::string& dir) const {
    if (count_ == 0) return absl::OkStatus();
    std::string more =
        count_ > items_.size() ? absl::StrCat("; and ", count_ - items_.size(), " more") : "";
    return absl::DataLossError(absl::StrCat(dir, ": checkpoint does not match its config (", count_,
                                            " problems): ", absl::StrJoin(items_, "; "), more));
  }

 private:
  static constexpr size_t kShown = 20;
  std::vector<std::string> items_;
  size_t count_ = 0;
};

bool RoleAccepts(TensorRole role, DType dtype) {
  return role == TensorRole::kExpert ? dtype == DType::kU8 : dtype != DType::kU8;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  if (!io::IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  auto config = LoadModelConfig(JoinPath(dir, "config.json"));
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);
  if (absl::Status s = ckpt->LoadShards(); !s.ok()) return s;
  if (absl::Status s = ckpt->CheckTensors(); !s.ok()) return s;
  if (absl::Status s = ckpt->LocateExperts(); !s.ok()) return s;
  return ckpt;
}

absl::Status Checkpoint::LoadShards() {
  std::map<std::string, std::string> index;
  const std::string index_path = JoinPath(dir_, kIndexFile);
  if (io::FileExists(index_path)) {
    auto parsed = ReadIndex(index_path);
    if (!parsed.ok()) return parsed.status();
    index = *std::move(parsed);
    std::vector<std::string> files;
    for (const auto& [name, file] : index) files.push_back(file);
    std::sort(files.begin(), files.end());
    files.erase(std::unique(files.begin(), files.end()), files.end());
    for (const std::string& f : files) {
      if (!io::FileExists(JoinPath(dir_, f))) {
        return absl::NotFoundError(
            absl::StrCat(index_path, " names shard ", f, ", which does not exist"));
      }
      shard_paths_.push_back(JoinPath(dir_, f));
    }
  } else if (io::FileExists(JoinPath(dir_, kSingleFile))) {
    shard_paths_.push_back(JoinPath(dir_, kSingleFile));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": neither ", kSingleFile, " nor ", kIndexFile, " found"));
  }

  for (size_t shard = 0; shard < shard_paths_.size(); ++shard) {
    auto file = io::RandomAccessFile::Open(shard_paths_[shard]);
    if (!file.ok()) return file.status();
    const io::RandomAccessFile& f = **file;
    uint8_t prefix[8] = {};
    if (f.size() >= 8) {
      if (absl::Status s = f.ReadAt(0, prefix); !s.ok()) return s;
    }
    auto length = ParseHeaderLength(prefix, f.size(), f.path());
    if (!length.ok()) return length.status();
    std::string header(*length, '\0');
    if (absl::Status s = f.ReadAt(8, {reinterpret_cast<uint8_t*>(header.data()), header.size()});
        !s.ok()) {
      return s;
    }
    auto tensors = ParseSafetensorsHeader(header, f.size(), static_cast<int>(shard), f.path());
    if (!tensors.ok()) return tensors.status();
    for (TensorInfo& t : *tensors) {
      auto [it, inserted] = by_name_.emplace(t.name, tensors_.size());
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("tensor ", t.name, " is in both ",
                                                shard_paths_[tensors_[it->second].shard], " and ",
                                                f.path()));
      }
      tensors_.push_back(std::move(t));
    }
    files_.push_back(*std::move(file));
  }
  // The index must agree with the headers it points at.
  for (const auto& [name, file] : index) {
    const TensorInfo* t = Find(name);
    if (t == nullptr || shard_paths_[t->shard] != JoinPath(dir_, file)) {
      return absl::DataLossError(absl::StrCat(index_path, " places tensor ", name, " in ", file,
                                              ", but that shard's header does not list it"));
    }
  }
  names_ = TensorNames(
      Find("language_model.model.embed_tokens.weight") != nullptr ? "language_model." : "");
  return absl::OkStatus();
}

absl::Status Checkpoint::CheckTensors() {
  TensorProblems problems;
  auto check = [&](const TensorSpec& spec) {
    const TensorInfo* t = Find(spec.name);
    if (t == nullptr) {
      problems.Add(absl::StrCat(spec.name, " is missing"));
      return;
    }
    bool shape_ok = t->shape == spec.shape;
    if (spec.shape_is_minimum) {
      shape_ok = t->shape.size() == 1 && t->shape[0] >= spec.shape[0];
    }
    if (!shape_ok) {
      problems.Add(absl::StrCat(spec.name, " has shape ", ShapeText(t->shape), ", expected ",
                                spec.shape_is_minimum ? "at least " : "", ShapeText(spec.shape),
                                " (", shard_paths_[t->shard], ")"));
    } else if (!RoleAccepts(spec.role, t->dtype)) {
      problems.Add(absl::StrCat(spec.name, " has dtype ", DTypeName(t->dtype), ", expected ",
                                spec.role == TensorRole::kExpert ? "U8" : "BF16, F16 or F32"));
    }
  };
  for (const TensorSpec& spec : TrunkTensorSpecs(config_, names_)) check(spec);
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      for (const TensorSpec& spec : ExpertTensorSpecs(config_, names_, l, e)) check(spec);
    }
  }
  return problems.ToStatus(dir_);
}

absl::Status Checkpoint::LocateExperts() {
  experts_.assign(config_.num_layers * config_.num_experts, {});
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      ExpertLocation& loc = experts_[l * config_.num_experts + e];
      for (int part = 0; part < 6; ++part) {
        const TensorInfo* t = Find(names_.Expert(l, e, part));
        loc.part_offset[part] = loc.total_bytes;
        loc.total_bytes += t->byte_size;
        ByteSpan* last = loc.spans.empty() ? nullptr : &loc.spans.back();
        if (last != nullptr && last->shard == t->shard &&
            last->offset + last->length == t->file_offset) {
          last->length += t->byte_size;  // adjacent, as released: one read covers both
        } else {
          loc.spans.push_back({t->shard, t->file_offset, t->byte_size});
        }
      }
    }
  }
  return absl::OkStatus();
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->size();
  return total;
}

const TensorInfo* Checkpoint::Find(std::string_view full_name) const {
  auto it = by_name_.find(absl::string_view(full_name.data(), full_name.size()));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status Checkpoint::ReadTensor(const TensorInfo& tensor, std::span<uint8_t> out) const {
  if (out.size() != tensor.byte_size) {
    return absl::InternalError(absl::StrCat("ReadTensor ", tensor.name, ": buffer of ", out.size(),
                                            " bytes for ", tensor.byte_size));
  }
  return files_[tensor.shard]->ReadAt(tensor.file_offset, out);
}

absl::Status Checkpoint::ReadSpan(const ByteSpan& span, std::span<uint8_t> out) const {
  return files_[span.shard]->ReadAt(span.offset, out.first(span.length));
}

absl::StatusOr<std::vector<float>> Checkpoint::ReadTensorAsFloat(const TensorInfo& tensor) const {
  std::vector<uint8_t> raw(tensor.byte_size);
  if (absl::Status s = ReadTensor(tensor, raw); !s.ok()) return s;
  const int64_t n = tensor.elements();
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (tensor.dtype) {
      case DType::kF32:
        std::memcpy(&out[i], &raw[4 * i], 4);
        break;
      case DType::kBF16:
        out[i] = BF16ToFloat(raw[2 * i] | (raw[2 * i + 1] << 8));
        break;
      case DType::kF16:
        out[i] = HalfToFloat(raw[2 * i] | (raw[2 * i + 1] << 8));
        break;
      case DType::kU8:
        return absl::InvalidArgumentError(absl::StrCat(tensor.name, " is U8, not a float tensor"));
    }
  }
  return out;
}

}  // namespace k3
