#include "core/model/step_scratch.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace k3 {
namespace {

// Floats a token takes in each buffer of a part, in the order the part's spans are carved: the
// one layout both the buffers and the plan's bytes come from.
template <size_t N>
using Widths = std::array<size_t, N>;

Widths<8> KdaWidths(const ModelConfig& c) {  // q, k, v, gate, z, o, low, beta
  const size_t w = c.kda_width();
  return {
      w, w, w, w, w, w, static_cast<size_t>(c.kda_head_dim), static_cast<size_t>(c.kda_num_heads)};
}

Widths<5> MlaWidths(const ModelConfig& c) {  // cq, q, kv (latent and rope key), gate, o
  const size_t heads = c.num_attention_heads;
  return {static_cast<size_t>(c.q_lora_rank), heads * c.mla_q_head_dim(),
          static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim), heads * c.v_head_dim,
          heads * c.v_head_dim};
}

Widths<2> DenseWidths(const ModelConfig& c) {  // gate, up
  const size_t w = c.intermediate_size;
  return {w, w};
}

// logits, z, shared, slots, agg, then the shared MLP's gate and up.
Widths<7> MoeWidths(const ModelConfig& c) {
  const size_t latent = c.routed_expert_hidden_size, shared = c.shared_width();
  return {static_cast<size_t>(c.num_experts),
          latent,
          c.num_shared_experts > 0 ? static_cast<size_t>(c.hidden_size) : 0,
          static_cast<size_t>(c.num_experts_per_token) * latent,
          latent,
          shared,
          shared};
}

// An expert pass's in, gate, up and y, a row.
Widths<4> ExpertPassWidths(const ModelConfig& c) {
  const size_t latent = c.routed_expert_hidden_size, width = c.moe_intermediate_size;
  return {latent, width, width, latent};
}

template <size_t N>
size_t Sum(const Widths<N>& w) {
  return std::accumulate(w.begin(), w.end(), size_t{0});
}

size_t PartWidth(const ModelConfig& c) {
  return std::max({Sum(KdaWidths(c)), Sum(MlaWidths(c)), Sum(DenseWidths(c)), Sum(MoeWidths(c))});
}

// The blocks Model::Layer begins, each keeping a snapshot to the end of the step.
size_t Blocks(const ModelConfig& c) {
  size_t blocks = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) blocks += c.is_block_boundary(l) ? 1 : 0;
  return blocks;
}

// prefix, h, x and branch.
constexpr size_t kStreamBuffers = 4;

template <size_t N>
std::array<std::span<float>, N> Carve(std::vector<float>& part, size_t tokens,
                                      const Widths<N>& widths) {
  std::array<std::span<float>, N> spans;
  size_t at = 0;
  for (size_t i = 0; i < N; ++i) {
    spans[i] = {part.data() + at, tokens * widths[i]};
    at += tokens * widths[i];
  }
  return spans;
}

// A fresh allocation of exactly `n` floats: growing by resize may over-allocate, and the
// capacities are what the plan is checked against.
void Fit(std::vector<float>& v, size_t n) {
  if (v.size() < n) v = std::vector<float>(n);
}

uint64_t CapacityBytes(const std::vector<float>& v) { return 4 * uint64_t{v.capacity()}; }

}  // namespace

StepScratch::StepScratch(const ModelConfig& config)
    : config_(config), hidden_(config.hidden_size), snapshots_(Blocks(config)) {}

uint64_t StepScratch::Bytes(const ModelConfig& c, size_t tokens) {
  const uint64_t per_token = (kStreamBuffers + Blocks(c)) * c.hidden_size + PartWidth(c);
  return 4 * per_token * tokens;
}

uint64_t StepScratch::ExpertPassBytes(const ModelConfig& c) {
  // And the input's layout (Mxfp4Activations), a latent row per row where the widths are
  // multiples of its 512-column blocks, as Kimi K3's are.
  return 4 * kExpertRowsPerPass * (Sum(ExpertPassWidths(c)) + c.routed_expert_hidden_size);
}

void StepScratch::Reserve(size_t tokens) {
  if (tokens <= tokens_) return;
  tokens_ = tokens;
  for (std::vector<float>* v : {&prefix_, &h_, &x_, &branch_}) Fit(*v, tokens * hidden_);
  for (std::vector<float>& s : snapshots_) Fit(s, tokens * hidden_);
  Fit(part_, tokens * PartWidth(config_));
}

uint64_t StepScratch::allocated_bytes() const {
  uint64_t bytes = CapacityBytes(part_);
  for (const std::vector<float>* v : {&prefix_, &h_, &x_, &branch_}) bytes += CapacityBytes(*v);
  for (const std::vector<float>& s : snapshots_) bytes += CapacityBytes(s);
  return bytes;
}

uint64_t StepScratch::expert_pass_bytes() const {
  uint64_t bytes = 0;
  passes_.ForEachIdle([&](const ExpertPass& p) {
    for (const std::vector<float>* v : {&p.in, &p.gate, &p.up, &p.y}) bytes += CapacityBytes(*v);
  });
  return bytes;
}

uint64_t StepScratch::attention_head_bytes() const {
  uint64_t bytes = 0;
  heads_.ForEachIdle([&](const AttentionHead& h) {
    for (const std::vector<float>* v : {&h.q_hat, &h.ctx, &h.scores}) bytes += CapacityBytes(*v);
  });
  return bytes;
}

StepScratch::KdaBuffers StepScratch::kda(size_t tokens) {
  const auto [q, k, v, gate, z, o, low, beta] = Carve(part_, tokens, KdaWidths(config_));
  return {q, k, v, gate, z, o, low, beta};
}

StepScratch::MlaBuffers StepScratch::mla(size_t tokens) {
  const auto [cq, q, kv, gate, o] = Carve(part_, tokens, MlaWidths(config_));
  return {cq, q, kv, gate, o};
}

StepScratch::MlpBuffers StepScratch::dense(size_t tokens) {
  const auto [gate, up] = Carve(part_, tokens, DenseWidths(config_));
  return {gate, up};
}

StepScratch::MoeBuffers StepScratch::moe(size_t tokens) {
  const auto [logits, z, shared, slots, agg, shared_gate, shared_up] =
      Carve(part_, tokens, MoeWidths(config_));
  return {logits, z, shared, slots, agg, {shared_gate, shared_up}};
}

StepScratch::Lender<StepScratch::ExpertPass>::Loan StepScratch::BorrowExpertPass(size_t rows) {
  return passes_.Borrow([&](ExpertPass& pass) {
    const Widths<4> widths = ExpertPassWidths(config_);
    std::vector<float>* buffers[] = {&pass.in, &pass.gate, &pass.up, &pass.y};
    for (size_t i = 0; i < widths.size(); ++i) Fit(*buffers[i], rows * widths[i]);
  });
}

StepScratch::Lender<StepScratch::AttentionHead>::Loan StepScratch::BorrowAttentionHead(
    size_t positions) {
  return heads_.Borrow([&](AttentionHead& head) {
    Fit(head.q_hat, config_.kv_lora_rank);
    Fit(head.ctx, config_.kv_lora_rank);
    // Decoding attends one position more each token: growing geometrically reallocates rarely.
    if (head.scores.size() < positions) head.scores.resize(positions);
  });
}

}  // namespace k3
