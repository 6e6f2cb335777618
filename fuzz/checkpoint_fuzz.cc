// Checkpoint::Open on a damaged checkpoint directory: a fixed small config.json, and from the
// input the shard index and three shard files (parts cut at fuzz_util.h's separator), named as
// `k3 synth` names them. With an
// empty index part there is no index and the first shard is model.safetensors. Opening must
// refuse what does not fit its config with a status, never crash or over-read; an opened
// checkpoint must be readable as it describes itself.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/small_model.h"

namespace {

constexpr const char* kShards[] = {"model-00001-of-00003.safetensors",
                                   "model-00002-of-00003.safetensors",
                                   "model-00003-of-00003.safetensors"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const k3::fuzzing::ScratchDir& dir = k3::fuzzing::Scratch();
  dir.Clear();
  auto parts =
      k3::fuzzing::SplitParts(std::string_view(reinterpret_cast<const char*>(data), size), 4);
  // The seeds are `k3 synth --preset tiny` with the same shape.
  dir.Write("config.json", k3::fuzzing::kSmallModelConfig);
  if (parts[0].empty()) {
    dir.Write("model.safetensors", parts[1]);
  } else {
    dir.Write("model.safetensors.index.json", parts[0]);
    for (int i = 0; i < 3; ++i) dir.Write(kShards[i], parts[i + 1]);
  }
  auto ckpt = k3::Checkpoint::Open(dir.path().string());
  if (!ckpt.ok()) return 0;
  // Whatever Open accepted must be readable as described: every tensor and every expert span.
  for (const k3::TensorInfo& t : (*ckpt)->tensors()) {
    std::vector<uint8_t> bytes(t.byte_size);
    if (!(*ckpt)->ReadTensor(t, bytes).ok()) std::abort();
    if (t.dtype != k3::DType::kU8 && !(*ckpt)->ReadTensorAsFloat(t).ok()) std::abort();
  }
  const k3::ModelConfig& c = (*ckpt)->config();
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const k3::ExpertLocation& loc = (*ckpt)->expert(l, e);
      if (loc.total_bytes != static_cast<uint64_t>(c.expert_bytes())) std::abort();
      for (const k3::ByteSpan& span : loc.spans) {
        std::vector<uint8_t> bytes(span.length);
        if (!(*ckpt)->ReadSpan(span, bytes).ok()) std::abort();
      }
    }
  }
  return 0;
}
