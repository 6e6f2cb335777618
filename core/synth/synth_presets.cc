// The shapes `k3 synth` writes (DESIGN.md section 6).
#include <string>

#include "absl/strings/str_cat.h"
#include "core/synth/synth.h"

namespace k3 {
namespace {

ModelConfig TinyPreset() {  // the shape of ../shared/fixtures/reference-tiny
  ModelConfig c;
  c.hidden_size = 128;
  c.num_layers = 13;
  c.vocab_size = 256;
  c.attn_res_block_size = 3;
  c.kda_num_heads = 4;
  c.kda_head_dim = 16;
  c.num_attention_heads = 4;
  c.q_lora_rank = 64;
  c.kv_lora_rank = 32;
  c.qk_nope_head_dim = 24;
  c.qk_rope_head_dim = 8;
  c.v_head_dim = 16;
  c.full_attn_layers = {4, 8, 12, 13};
  c.intermediate_size = 96;
  c.num_experts = 8;
  c.num_experts_per_token = 2;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 64;
  c.moe_intermediate_size = 64;
  return c;
}

ModelConfig DemoPreset() {  // a few hundred MB; experts outgrow small budgets
  ModelConfig c;
  c.hidden_size = 256;
  c.num_layers = 8;
  c.vocab_size = 4096;
  c.attn_res_block_size = 3;
  c.kda_num_heads = 4;
  c.kda_head_dim = 64;
  c.num_attention_heads = 4;
  c.q_lora_rank = 128;
  c.kv_lora_rank = 64;
  c.qk_nope_head_dim = 32;
  c.qk_rope_head_dim = 16;
  c.v_head_dim = 32;
  c.full_attn_layers = {4, 8};
  c.intermediate_size = 768;
  c.num_experts = 64;
  c.num_experts_per_token = 8;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 512;
  c.moe_intermediate_size = 384;
  return c;
}

ModelConfig BenchPreset() {  // real 17,547,264-byte experts, ~16 GB of them
  ModelConfig c;
  c.hidden_size = 1024;
  c.num_layers = 8;
  c.vocab_size = 32768;
  c.attn_res_block_size = 4;
  c.kda_num_heads = 8;
  c.kda_head_dim = 128;
  c.num_attention_heads = 8;
  c.q_lora_rank = 256;
  c.kv_lora_rank = 128;
  c.qk_nope_head_dim = 64;
  c.qk_rope_head_dim = 32;
  c.v_head_dim = 64;
  c.full_attn_layers = {4, 8};
  c.intermediate_size = 2048;
  c.num_experts = 128;
  c.num_experts_per_token = 16;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 3584;
  c.moe_intermediate_size = 3072;
  return c;
}

ModelConfig FullPreset() {  // Kimi K3's text config (MODEL.md 1.2): 1.56 TB, use --sparse
  ModelConfig c;
  c.hidden_size = 7168;
  c.num_layers = 93;
  c.vocab_size = 163840;
  c.attn_res_block_size = 12;
  c.kda_num_heads = 96;
  c.kda_head_dim = 128;
  c.num_attention_heads = 96;
  c.q_lora_rank = 1536;
  c.kv_lora_rank = 512;
  c.qk_nope_head_dim = 128;
  c.qk_rope_head_dim = 64;
  c.v_head_dim = 128;
  for (int64_t l = 4; l <= 92; l += 4) c.full_attn_layers.push_back(l);
  c.full_attn_layers.push_back(93);
  c.first_k_dense_replace = 1;
  c.intermediate_size = 33792;
  c.num_experts = 896;
  c.num_experts_per_token = 16;
  c.num_shared_experts = 2;
  c.routed_expert_hidden_size = 3584;
  c.moe_intermediate_size = 3072;
  return c;
}

// Kimi K3's dimensions for every tensor (FullPreset) in 6 layers: the dense layer 0 at its
// 33,792 width, MoE layers 1-5 of 128 real-size experts, MLA at one-based 4 and 6 (the
// release's list also ends on two MLA layers, 92 and 93). 23.7 GB, 12.5 of them trunk with the
// real 163,840-entry vocabulary: a trunk that streams at any budget of a few GB.
ModelConfig SlicePreset() {
  ModelConfig c = FullPreset();
  c.num_layers = 6;
  c.full_attn_layers = {4, 6};
  c.num_experts = 128;
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> SynthPresetConfig(std::string_view preset) {
  ModelConfig c;
  if (preset == "tiny")
    c = TinyPreset();
  else if (preset == "demo")
    c = DemoPreset();
  else if (preset == "bench")
    c = BenchPreset();
  else if (preset == "slice")
    c = SlicePreset();
  else if (preset == "full")
    c = FullPreset();
  else {
    return absl::InvalidArgumentError(absl::StrCat("unknown preset \"", std::string(preset),
                                                   "\" (choose tiny, demo, bench, slice or full)"));
  }
  return ApplyConfigOverrides(c, {});  // validates and derives the layer map
}

}  // namespace k3
