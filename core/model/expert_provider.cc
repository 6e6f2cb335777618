#include "core/model/expert_provider.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace k3 {
namespace {

kernels::Mxfp4Matrix View(std::span<const uint8_t> bytes, const ExpertLocation& loc, int part,
                          int64_t rows, int64_t cols) {
  const size_t packed = static_cast<size_t>(rows * cols / 2);
  const size_t scales = static_cast<size_t>(rows * cols / 32);
  return {bytes.subspan(loc.part_offset[part], packed),
          bytes.subspan(loc.part_offset[part + 1], scales), static_cast<size_t>(rows),
          static_cast<size_t>(cols)};
}

// The file and offset where byte `index` of an expert's concatenated spans lies.
std::pair<int, uint64_t> Locate(const ExpertLocation& loc, uint64_t index) {
  for (const ByteSpan& s : loc.spans) {
    if (index < s.length) return {s.shard, s.offset + index};
    index -= s.length;
  }
  return {loc.spans.back().shard, loc.spans.back().offset + loc.spans.back().length};
}

}  // namespace

ExpertWeights ViewExpert(const ModelConfig& c, const ExpertLocation& loc,
                         std::span<const uint8_t> bytes) {
  const int64_t m = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  return {View(bytes, loc, 0, m, lat), View(bytes, loc, 2, lat, m), View(bytes, loc, 4, m, lat)};
}

absl::Status CheckExpertBytes(const Checkpoint& ckpt, int64_t layer, int64_t expert,
                              std::span<const uint8_t> bytes) {
  const ExpertLocation& loc = ckpt.expert(layer, expert);
  if (bytes.size() != loc.total_bytes) {
    return absl::DataLossError(absl::StrCat("expert ", expert, " of layer ", layer, ": got ",
                                            bytes.size(), " bytes, expected ", loc.total_bytes));
  }
  for (int part = 1; part < 6; part += 2) {  // the three weight_scale tensors
    const uint64_t begin = loc.part_offset[part];
    auto bad = kernels::FindInvalidMxfp4Scale(bytes.subspan(begin, ckpt.PartBytes(part)));
    if (bad.has_value()) {
      auto [shard, offset] = Locate(loc, begin + *bad);
      return absl::DataLossError(absl::StrCat(
          ckpt.names().Expert(layer, expert, part), ": scale byte 0xFF (NaN in E8M0) at index ",
          *bad, ", offset ", offset, " of ", ckpt.shard_paths()[shard]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointExpertProvider::ForEachExpert(int64_t layer,
                                                     std::span<const int32_t> experts,
                                                     const ExpertUse& use,
                                                     const std::function<void()>& alongside) {
  if (alongside) alongside();
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < experts.size(); ++i) {
    const ExpertLocation& loc = ckpt_.expert(layer, experts[i]);
    bytes.resize(loc.total_bytes);
    uint64_t at = 0;
    for (const ByteSpan& s : loc.spans) {
      absl::Status st = ckpt_.ReadSpan(s, {bytes.data() + at, s.length});
      if (!st.ok()) return st;
      at += s.length;
    }
    if (absl::Status st = CheckExpertBytes(ckpt_, layer, experts[i], bytes); !st.ok()) return st;
    use(i, ViewExpert(ckpt_.config(), loc, bytes));
  }
  return absl::OkStatus();
}

}  // namespace k3
