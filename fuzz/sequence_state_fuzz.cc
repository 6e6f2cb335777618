// SequenceState::Load on damaged or foreign state files. The model is small (one KDA layer,
// one MLA layer) so that a seed state fits in a few kilobytes. Load must refuse what does not
// match with a status, never over-read or allocate what the file merely claims; a state it
// accepts must save back to the same bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.h"
#include "core/model/sequence_state.h"
#include "fuzz/fuzz_util.h"
#include "io/file.h"

namespace {

constexpr char kConfig[] = R"({
  "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 16,
  "kda_num_heads": 1, "kda_head_dim": 8, "num_attention_heads": 1, "q_lora_rank": 8,
  "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
  "full_attn_layers": [2], "first_k_dense_replace": 1, "intermediate_size": 8,
  "num_experts": 2, "num_experts_per_token": 1, "num_shared_experts": 1,
  "moe_intermediate_size": 32, "routed_expert_hidden_size": 32, "attn_res_block_size": 1
})";

const k3::ModelConfig& Model() {
  static const k3::ModelConfig* const kModel = [] {
    auto c = k3::ParseModelConfigText(kConfig, "fuzz config");
    if (!c.ok()) std::abort();
    return new k3::ModelConfig(*std::move(c));
  }();
  return *kModel;
}

}  // namespace

// K3_FUZZ_WRITE_SEED=FILE writes a valid state of two tokens (the seed in corpus/) and exits:
// the file holds the config fingerprint, which only this code computes.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* seed = std::getenv("K3_FUZZ_WRITE_SEED");
  if (seed == nullptr) return 0;
  k3::SequenceState state(Model());
  const int32_t tokens[] = {3, 5};
  state.AppendTokens(tokens);
  for (int64_t l = 0; l < Model().num_layers; ++l) {
    if (Model().attention_kind(l) == k3::AttentionKind::kMla) {
      state.mla_cache(l).assign(2 * state.latent_width(), 0.5f);
    } else {
      state.kda_state(l)[0] = 1.0f;
    }
  }
  std::exit(state.Save(seed).ok() ? 0 : 1);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const k3::ModelConfig& model = Model();
  const k3::fuzzing::ScratchDir& dir = k3::fuzzing::Scratch();
  const std::string in(reinterpret_cast<const char*>(data), size);
  const std::string path = dir.Write("state.bin", in);
  auto state = k3::SequenceState::Load(path, model);
  if (!state.ok()) return 0;
  const std::string again = (dir.path() / "again.bin").string();
  if (!state->Save(again).ok()) std::abort();
  auto saved = k3::io::ReadFileToString(again);
  if (!saved.ok() || *saved != in) std::abort();
  return 0;
}
