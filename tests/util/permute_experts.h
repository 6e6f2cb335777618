// Rewrites a checkpoint so that every routed expert's six tensors stay in the byte range they
// share but lie in another order within it: a layout that is one read per expert, though not in
// name order. Tensor names, shapes and bytes are unchanged; only the header offsets and where
// the bytes sit move.
#pragma once

#include <array>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "io/file.h"
#include "nlohmann/json.hpp"

namespace k3::testing {

// `order` lists part indices (kExpertParts order) as they are to appear in the file.
inline absl::Status PermuteExpertParts(const std::string& dir, const std::array<int, 6>& order) {
  auto ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  const Checkpoint& c = **ckpt;
  const ModelConfig& config = c.config();
  for (size_t shard = 0; shard < c.shard_paths().size(); ++shard) {
    const std::string& path = c.shard_paths()[shard];
    auto file = io::ReadFileToString(path);
    if (!file.ok()) return file.status();
    uint64_t header_length = 0;
    std::memcpy(&header_length, file->data(), 8);  // little-endian, as on every host we build for
    const uint64_t data_start = 8 + header_length;
    nlohmann::ordered_json header = nlohmann::ordered_json::parse(file->substr(8, header_length));
    std::string data = file->substr(data_start);
    bool changed = false;
    for (int64_t l = config.first_k_dense_replace; l < config.num_layers; ++l) {
      for (int64_t e = 0; e < config.num_experts; ++e) {
        const ExpertLocation& loc = c.expert(l, e);
        if (!loc.contiguous() || loc.spans[0].shard != static_cast<int>(shard)) continue;
        uint64_t at = loc.spans[0].offset - data_start;
        for (int part : order) {
          const TensorInfo* t = c.Find(c.names().Expert(l, e, part));
          if (t == nullptr) return absl::InternalError("an expert part went missing");
          const uint64_t from = t->file_offset - data_start;
          std::memcpy(data.data() + at, file->data() + data_start + from, t->byte_size);
          header[t->name]["data_offsets"] = {at, at + t->byte_size};
          at += t->byte_size;
        }
        changed = true;
      }
    }
    if (!changed) continue;
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    const uint64_t length = text.size();
    std::memcpy(out.data(), &length, 8);
    absl::StrAppend(&out, text, data);
    if (absl::Status s = io::WriteFileAtomically(path, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace k3::testing
