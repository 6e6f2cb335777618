#include "core/checkpoint/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/checkpoint/json_reader.h"
#include "core/util/numeric.h"
#include "core/util/problem_list.h"
#include "core/util/absl_compat.h"

namespace k3 {
namespace {

namespace od = simdjson::ondemand;
using simdjson::error_code;
using tokenizer_internal::Av;

constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";
// The index is read whole; the release's is 59.8 MB. A larger one is refused as corrupt rather
// than read into memory.
constexpr uint64_t kMaxIndexBytes = 1ull << 30;

bool RoleAccepts(TensorRole role, DType dtype) {
  return role == TensorRole::kExpert ? dtype == DType::kU8 : dtype != DType::kU8;
}

}  // namespace

// What model.safetensors.index.json says, kept as compactly as the tensors themselves.
struct Checkpoint::IndexScan {
  std::vector<std::string> files;   // by id, in order of first mention
  std::vector<uint16_t> part_file;  // [slot]: file id + 1 of an expert part; 0: not listed
  std::vector<std::pair<std::string, uint16_t>> others;  // every other name, with its file id
};

class Checkpoint::HeaderSink : public SafetensorsSink {
 public:
  HeaderSink(Checkpoint& c, int shard) : c_(c), shard_(shard) {}
  absl::Status Add(const TensorEntry& e) override {
    return c_.AddTensor(e.name, e.dtype, e.shape, shard_, e.file_offset, e.byte_size);
  }

 private:
  Checkpoint& c_;
  int shard_;
};

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  if (!io::IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("model directory ", dir, " does not exist"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  auto config = LoadModelConfig(io::JoinPath(dir, "config.json"));
  if (!config.ok()) return config.status();
  ckpt->config_ = *std::move(config);
  if (absl::Status s = ckpt->LoadShards(); !s.ok()) return s;
  if (absl::Status s = ckpt->CheckTensors(); !s.ok()) return s;
  ckpt->LocateExperts();
  return ckpt;
}

int64_t Checkpoint::SlotOf(const ExpertName& n, std::string_view prefix) const {
  if (n.prefix != prefix || n.layer < config_.first_k_dense_replace ||
      n.layer >= config_.num_layers || n.expert >= config_.num_experts) {
    return -1;
  }
  return static_cast<int64_t>(Slot(n.layer, n.expert, n.part));
}

int64_t Checkpoint::NoteExpertName(std::string_view name, ExpertName* n) {
  if (!ParseExpertName(name, n)) return -1;
  if (!expert_prefix_set_) {  // the first part seen, in the index or a header, decides
    expert_prefix_ = n->prefix;
    expert_prefix_set_ = true;
  }
  return SlotOf(*n, expert_prefix_);
}

absl::Status Checkpoint::Duplicate(std::string_view name, int first, int second) const {
  if (first == second) {
    return absl::DataLossError(absl::StrCat(shard_paths_[second],
                                            ": corrupt safetensors header: tensor ", Av(name),
                                            " is listed twice"));
  }
  return absl::DataLossError(absl::StrCat("tensor ", Av(name), " is in both ", shard_paths_[first],
                                          " and ", shard_paths_[second]));
}

absl::Status Checkpoint::AddTensor(std::string_view name, DType dtype,
                                   std::span<const int64_t> shape, int shard, uint64_t offset,
                                   uint64_t size) {
  ExpertName n;
  const int64_t slot = NoteExpertName(name, &n);
  if (slot >= 0 && part_shard_[slot] >= 0) return Duplicate(name, part_shard_[slot], shard);
  if (slot >= 0 && dtype == DType::kU8 && std::ranges::equal(shape, part_shape_[n.part])) {
    if (listed_expert_names_ > 0) {
      if (const TensorInfo* t = FindListed(name); t != nullptr) {
        return Duplicate(name, t->shard, shard);
      }
    }
    part_shard_[slot] = shard;
    experts_[n.layer * config_.num_experts + n.expert].part_offset[n.part] = offset;
    ++expert_part_count_;
    return absl::OkStatus();
  }
  listed_.push_back({std::string(name), dtype, {shape.begin(), shape.end()}, shard, offset, size});
  auto [it, inserted] = by_name_.emplace(listed_.back().name, listed_.size() - 1);
  if (!inserted) {
    listed_.pop_back();
    return Duplicate(name, listed_[it->second].shard, shard);
  }
  listed_expert_names_ += slot >= 0;
  return absl::OkStatus();
}

absl::Status Checkpoint::ScanIndex(const std::string& path, JsonReader& reader, IndexScan& index) {
  auto file = io::RandomAccessFile::Open(path);
  if (!file.ok()) return file.status();
  auto error = [&](std::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": ", Av(what)));
  };
  if ((*file)->size() > kMaxIndexBytes) {
    return error(absl::StrCat("is ", (*file)->size(), " bytes, more than any index (limit ",
                              kMaxIndexBytes, ")"));
  }
  if (absl::Status s = reader.Load(**file, 0, (*file)->size()); !s.ok()) return s;
  od::document doc;
  auto invalid = [&](error_code e) {
    return error(
        absl::StrCat(e == simdjson::DEPTH_ERROR ? "nests values too deep (" : "not valid JSON (",
                     reader.Describe(e, doc), ")"));
  };
  od::json_type type;
  error_code e = reader.Start(doc);
  if (!e) e = doc.type().get(type);
  if (e) return invalid(e);
  if (type != od::json_type::object) {
    if ((e = reader.SkipDocument(doc))) return invalid(e);
    return error("not a JSON object");
  }
  index.part_file.assign(part_shard_.size(), 0);
  absl::flat_hash_map<std::string, uint16_t> ids;
  bool has_map = false;
  std::string name;
  od::object root;
  if ((e = doc.get_object().get(root))) return invalid(e);
  for (auto member : root) {
    od::field field;
    std::string_view key;
    if ((e = reader.Member(std::move(member), field, key, type))) return invalid(e);
    if (key != "weight_map" || type != od::json_type::object) {
      if (key == "weight_map") has_map = false;
      if ((e = reader.Skip(field.value()))) return invalid(e);
      continue;
    }
    has_map = true;
    od::object map;
    if ((e = field.value().get_object().get(map))) return invalid(e);
    for (auto entry_result : map) {
      od::field entry;
      std::string_view text;
      if ((e = reader.Member(std::move(entry_result), entry, text, type))) return invalid(e);
      name.assign(text);
      if (type != od::json_type::string) {
        if ((e = reader.Skip(entry.value()))) return invalid(e);
        return error(
            absl::StrCat("weight_map entry for ", name, " is not a file name in the directory"));
      }
      std::string_view shard_file;
      if ((e = reader.String(entry.value(), shard_file))) return invalid(e);
      if (shard_file.find('/') != std::string::npos) {
        return error(
            absl::StrCat("weight_map entry for ", name, " is not a file name in the directory"));
      }
      auto it = ids.find(Av(shard_file));
      if (it == ids.end()) {
        if (index.files.size() == UINT16_MAX) return error("names more than 65,535 shards");
        it = ids.emplace(std::string(shard_file), static_cast<uint16_t>(index.files.size())).first;
        index.files.emplace_back(shard_file);
      }
      ExpertName n;
      if (const int64_t slot = NoteExpertName(name, &n); slot >= 0) {
        index.part_file[slot] = static_cast<uint16_t>(it->second + 1);
      } else {
        index.others.emplace_back(name, it->second);
      }
    }
  }
  if ((e = reader.Finish(doc))) return invalid(e);
  if (!has_map) return error("no \"weight_map\" object");
  return absl::OkStatus();
}

absl::Status Checkpoint::CheckIndex(const std::string& path, const IndexScan& index,
                                    std::span<const int> shard_of_file) const {
  auto in_shard = [&](std::string_view name, int shard) {
    const TensorInfo* t = FindListed(name);
    if (t != nullptr) return t->shard == shard;
    ExpertName n;
    if (!ParseExpertName(name, &n)) return false;
    const int64_t slot = SlotOf(n, expert_prefix_);
    return slot >= 0 && part_shard_[slot] == shard;
  };
  auto refuse = [&](std::string_view name, uint16_t file) {
    return absl::DataLossError(absl::StrCat(path, " places tensor ", Av(name), " in ",
                                            index.files[file],
                                            ", but that shard's header does not list it"));
  };
  const TensorNames names(expert_prefix_);
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      for (int part = 0; part < 6; ++part) {
        const size_t slot = Slot(l, e, part);
        if (index.part_file[slot] == 0) continue;
        const int shard = shard_of_file[index.part_file[slot] - 1];
        if (part_shard_[slot] == shard) continue;
        const std::string name = names.Expert(l, e, part);  // a rare path: listed, or absent
        if (!in_shard(name, shard)) return refuse(name, index.part_file[slot] - 1);
      }
    }
  }
  for (const auto& [name, file] : index.others) {
    if (!in_shard(name, shard_of_file[file])) return refuse(name, file);
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::LoadShards() {
  const ModelConfig& c = config_;
  experts_.assign(c.num_layers * c.num_experts, {});
  part_shard_.assign(experts_.size() * 6, -1);
  const std::vector<TensorSpec> specs = ExpertTensorSpecs(c, names_, 0, 0);
  for (int part = 0; part < 6; ++part) part_shape_[part] = specs[part].shape;

  // One buffer and parser for the index and every header, grown to the largest of them (in a
  // release, the index): allocated once, their pages are faulted in once.
  JsonReader reader;
  IndexScan index;
  std::vector<int> shard_of_file;
  const std::string index_path = io::JoinPath(dir_, kIndexFile);
  const bool has_index = io::FileExists(index_path);
  if (has_index) {
    if (absl::Status s = ScanIndex(index_path, reader, index); !s.ok()) return s;
    std::vector<std::string> files = index.files;
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      if (!io::FileExists(io::JoinPath(dir_, f))) {
        return absl::NotFoundError(
            absl::StrCat(index_path, " names shard ", f, ", which does not exist"));
      }
      shard_paths_.push_back(io::JoinPath(dir_, f));
    }
    for (const std::string& f : index.files) {
      shard_of_file.push_back(
          static_cast<int>(std::lower_bound(files.begin(), files.end(), f) - files.begin()));
    }
  } else if (io::FileExists(io::JoinPath(dir_, kSingleFile))) {
    shard_paths_.push_back(io::JoinPath(dir_, kSingleFile));
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
    HeaderSink sink(*this, static_cast<int>(shard));
    if (absl::Status s =
            ScanSafetensorsHeader(HeaderSource(f, *length, reader), f.size(), f.path(), sink);
        !s.ok()) {
      return s;
    }
    files_.push_back(*std::move(file));
  }
  // The index must agree with the headers it points at.
  if (has_index) {
    if (absl::Status s = CheckIndex(index_path, index, shard_of_file); !s.ok()) return s;
  }
  const bool release =
      FindListed(absl::StrCat(tensor_name::kReleasePrefix, tensor_name::kEmbedding)) != nullptr;
  names_ = TensorNames(release ? std::string(tensor_name::kReleasePrefix) : "");
  if (expert_prefix_set_ && expert_prefix_ != names_.prefix()) KeepExpertsUnder(names_.prefix());
  return absl::OkStatus();
}

// Rare: the first expert part seen had another prefix than the embedding. The parts held so far
// become listed tensors, and every listed part under the embedding's prefix takes a slot.
void Checkpoint::KeepExpertsUnder(const std::string& prefix) {
  std::deque<TensorInfo> all = std::move(listed_);
  const TensorNames old_names(expert_prefix_);
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      for (int part = 0; part < 6; ++part) {
        const size_t slot = Slot(l, e, part);
        if (part_shard_[slot] < 0) continue;
        const uint64_t offset = experts_[l * config_.num_experts + e].part_offset[part];
        all.push_back({old_names.Expert(l, e, part), DType::kU8, part_shape_[part],
                       part_shard_[slot], offset, PartBytes(part)});
      }
    }
  }
  listed_.clear();
  by_name_.clear();
  std::fill(part_shard_.begin(), part_shard_.end(), -1);
  expert_part_count_ = 0;
  listed_expert_names_ = 0;
  expert_prefix_ = prefix;
  for (const TensorInfo& t : all) {
    // Every name was unique already, so this cannot fail.
    (void)AddTensor(t.name, t.dtype, t.shape, t.shard, t.file_offset, t.byte_size);
  }
}

absl::Status Checkpoint::CheckTensors() {
  ProblemList problems(20);
  auto check = [&](const TensorSpec& spec) {
    const TensorInfo* t = FindListed(spec.name);
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
  // A part in its slot has the name, dtype and shape the config asks for; only the others
  // need their name made and looked up.
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      for (int part = 0; part < 6; ++part) {
        if (part_shard_[Slot(l, e, part)] < 0)
          check(ExpertTensorSpecs(config_, names_, l, e)[part]);
      }
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(dir_, ": checkpoint does not match its config ", problems.Text()));
}

void Checkpoint::LocateExperts() {
  for (int64_t l = config_.first_k_dense_replace; l < config_.num_layers; ++l) {
    for (int64_t e = 0; e < config_.num_experts; ++e) {
      ExpertLocation& loc = experts_[l * config_.num_experts + e];
      // Parts in file order, whatever their names' order: six tensors that tile one byte range
      // in any permutation are still one read. Headers refuse overlaps, so the order is strict.
      std::array<int, 6> order = {0, 1, 2, 3, 4, 5};
      auto place = [&](int part) {
        return std::pair{part_shard_[Slot(l, e, part)], loc.part_offset[part]};
      };
      std::sort(order.begin(), order.end(), [&](int a, int b) { return place(a) < place(b); });
      for (int part : order) {
        const auto [shard, offset] = place(part);  // absolute until now
        const uint64_t size = PartBytes(part);
        loc.part_offset[part] = loc.total_bytes;
        loc.total_bytes += size;
        ByteSpan* last = loc.spans.empty() ? nullptr : &loc.spans.back();
        if (last != nullptr && last->shard == shard && last->offset + last->length == offset) {
          last->length += size;  // adjacent, as released: one read covers both
        } else {
          loc.spans.push_back({shard, offset, size});
        }
      }
    }
  }
  part_shard_ = {};  // the spans say it all now
}

uint64_t Checkpoint::PartBytes(int part) const {
  uint64_t n = 1;
  for (int64_t d : part_shape_[part]) n *= static_cast<uint64_t>(d);
  return n;
}

TensorInfo Checkpoint::ExpertPart(int64_t layer, int64_t e, int part) const {
  const ExpertLocation& loc = expert(layer, e);
  uint64_t at = loc.part_offset[part];
  const ByteSpan* span = &loc.spans.back();
  for (const ByteSpan& s : loc.spans) {
    if (at < s.length) {
      span = &s;
      break;
    }
    at -= s.length;
  }
  return {names_.Expert(layer, e, part),
          DType::kU8,
          part_shape_[part],
          span->shard,
          span->offset + at,
          PartBytes(part)};
}

TensorInfo Checkpoint::TensorAt(size_t i) const {
  if (i < listed_.size()) return listed_[i];
  const size_t j = i - listed_.size();
  const int64_t expert = static_cast<int64_t>(j / 6);
  return ExpertPart(config_.first_k_dense_replace + expert / config_.num_experts,
                    expert % config_.num_experts, static_cast<int>(j % 6));
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) total += f->size();
  return total;
}

const TensorInfo* Checkpoint::FindListed(std::string_view full_name) const {
  auto it = by_name_.find(full_name);
  return it == by_name_.end() ? nullptr : &listed_[it->second];
}

const TensorInfo* Checkpoint::Find(std::string_view full_name) const {
  if (const TensorInfo* t = FindListed(full_name); t != nullptr) return t;
  ExpertName n;
  if (!ParseExpertName(full_name, &n) || SlotOf(n, names_.prefix()) < 0) return nullptr;
  std::lock_guard<std::mutex> lock(made_mu_);
  auto [it, fresh] = made_.try_emplace(std::string(full_name));
  if (fresh) it->second = ExpertPart(n.layer, n.expert, n.part);
  return &it->second;
}

absl::Status Checkpoint::ReadTensor(const TensorInfo& tensor, std::span<uint8_t> out) const {
  if (out.size() != tensor.byte_size) {
    return absl::InternalError(absl::StrCat("ReadTensor ", tensor.name, ": buffer of ", out.size(),
                                            " bytes for ", tensor.byte_size));
  }
  return files_[tensor.shard]->ReadAt(tensor.file_offset, out);
}

absl::StatusOr<std::span<const uint8_t>> Checkpoint::ReadTensorDirect(
    const TensorInfo& tensor, std::span<uint8_t> buffer) const {
  return files_[tensor.shard]->ReadDirect(tensor.file_offset, tensor.byte_size, buffer);
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
