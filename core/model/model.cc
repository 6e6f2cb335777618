#include "core/model/model.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/tensor_names.h"
#include "kernels/model_ops.h"
#include "kernels/ops.h"

namespace k3 {
namespace {

namespace tn = tensor_name;
using kernels::Sigmoid;

// MLA LoRA norms use the first-party default epsilon, not rms_norm_eps (MODEL.md 0 Q1).
constexpr float kMlaLoraEps = 1e-6f;
constexpr float kL2Eps = 1e-6f;  // KDA q/k L2 norm, added to the sum of squares

std::span<float> Row(std::span<float> v, size_t row, size_t width) {
  return v.subspan(row * width, width);
}
std::span<const float> Row(std::span<const float> v, size_t row, size_t width) {
  return v.subspan(row * width, width);
}

// Moves the rows of `a` (`width` floats each) that `keep` lists, ascending, to its front in order:
// a row never moves back over one still to be read.
void KeepRows(std::span<float> a, std::span<const size_t> keep, size_t width) {
  for (size_t i = 0; i < keep.size(); ++i) {
    if (keep[i] != i) std::copy_n(a.begin() + keep[i] * width, width, a.begin() + i * width);
  }
}

bool Cancelled(const Model::Rows& rows) {
  return rows.cancelled != nullptr && rows.cancelled->load(std::memory_order_relaxed);
}

// Takes the segments cancelled since the last layer out of the step: their rows leave the
// stacked tokens, the residual stream and the first `blocks` block snapshots. False when none
// was.
bool DropCancelled(std::vector<Model::Rows>& rows, std::vector<int32_t>& ids, StepScratch& scratch,
                   size_t blocks, size_t width) {
  if (std::none_of(rows.begin(), rows.end(), Cancelled)) return false;
  std::vector<size_t> keep;  // token rows that stay
  std::vector<Model::Rows> kept_rows;
  for (const Model::Rows& r : rows) {
    if (Cancelled(r)) continue;
    Model::Rows kept = r;
    kept.first = keep.size();
    kept_rows.push_back(kept);
    for (size_t t = 0; t < r.count; ++t) keep.push_back(r.first + t);
  }
  const size_t tokens = ids.size();
  std::vector<int32_t> kept_ids(keep.size());
  for (size_t i = 0; i < keep.size(); ++i) kept_ids[i] = ids[keep[i]];
  ids = std::move(kept_ids);
  KeepRows(scratch.prefix(tokens), keep, width);
  for (size_t b = 0; b < blocks; ++b) KeepRows(scratch.snapshot(b, tokens), keep, width);
  rows = std::move(kept_rows);
  return true;
}

void ForEachToken(size_t tokens, const std::function<void(size_t)>& fn) {
  tbb::parallel_for(size_t{0}, tokens, fn);
}

// The segment that holds stacked row `t`.
size_t RowsOf(std::span<const Model::Rows> rows, size_t t) {
  size_t r = 0;
  while (t >= rows[r].first + rows[r].count) ++r;
  return r;
}

// Every layer already in memory.
class ResidentLayers : public LayerSource {
 public:
  explicit ResidentLayers(const TrunkWeights& trunk) : trunk_(trunk) {}
  absl::StatusOr<const LayerWeights*> AcquireLayer(int64_t layer) override {
    return &trunk_.layers[layer];
  }
  void ReleaseLayer(int64_t) override {}
  absl::Status Embed(std::span<const int32_t> ids, std::span<float> out) override {
    EmbedResident(trunk_.embed, ids, out);
    return absl::OkStatus();
  }

 private:
  const TrunkWeights& trunk_;
};

}  // namespace

void EmbedResident(const Matrix& embed, std::span<const int32_t> ids, std::span<float> out) {
  for (size_t t = 0; t < ids.size(); ++t) {
    RowToFloat(embed, ids[t], out.subspan(t * embed.cols, embed.cols));
  }
}

Model::Model(const ModelConfig& config, const TrunkWeights& trunk, ExpertProvider& experts)
    : config_(config),
      trunk_(trunk),
      experts_(experts),
      resident_(std::make_unique<ResidentLayers>(trunk)),
      layers_(resident_.get()),
      scratch_(config) {}

void Model::NormRows(std::span<const float> x, size_t tokens, std::span<const float> weight,
                     float eps, std::span<float> out) const {
  const size_t d = weight.size();
  for (size_t t = 0; t < tokens; ++t) {
    kernels::RmsNorm(Row(x, t, d), weight, eps, out.subspan(t * d, d));
  }
}

void Model::AttnRes(size_t blocks, std::span<const float> prefix, size_t tokens,
                    std::span<const float> fold, std::span<float> out) const {
  const size_t d = fold.size();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  ForEachToken(tokens, [&](size_t t) {
    std::vector<const float*> candidates;
    for (size_t b = 0; b < blocks; ++b) {
      candidates.push_back(scratch_.snapshot(b, tokens).data() + t * d);
    }
    candidates.push_back(prefix.data() + t * d);
    kernels::AttnResMix(candidates, fold, eps, out.subspan(t * d, d));
  });
}

void Model::Kda(int64_t layer, const KdaWeights& w, std::span<const float> x,
                std::span<const Rows> rows, size_t tokens, const StepScratch::KdaBuffers& b,
                std::span<float> out) const {
  const size_t heads = config_.kda_num_heads, dim = config_.kda_head_dim;
  const size_t width = heads * dim, kernel = config_.short_conv_kernel_size;
  // Named copies, not structured bindings: lambdas below capture them (clang 14 refuses to
  // capture a binding).
  const std::span<float> q = b.q, k = b.k, v = b.v, gate = b.gate, z = b.z, o = b.o, low = b.low,
                         beta = b.beta;
  // The output's buffer holds the raw projections first: one activation of a prompt chunk less.
  const std::span<float> raw = o;
  // Projections, then the causal convolutions (which advance the carried history).
  const std::pair<const Matrix*, std::span<float>> qkv[3] = {{&w.q, q}, {&w.k, k}, {&w.v, v}};
  const std::vector<float>* conv[3] = {&w.q_conv, &w.k_conv, &w.v_conv};
  for (int i = 0; i < 3; ++i) {
    MatMul(*qkv[i].first, x, tokens, raw);
    for (const Rows& r : rows) {  // each sequence's convolution carries its own history
      const size_t at = r.first * width, n = r.count * width;
      kernels::ShortConvSilu({raw.data() + at, n}, r.count, width, *conv[i], kernel,
                             r.state->conv_history(layer, i), qkv[i].second.subspan(at, n));
    }
  }
  MatMul(w.g, x, tokens, gate);
  MatMul(w.f_a, x, tokens, low);
  MatMul(w.f_b, low, tokens, z);
  MatMul(w.b, x, tokens, beta);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const float lower_bound = static_cast<float>(config_.gate_lower_bound);
  ForEachToken(tokens, [&](size_t t) {
    kernels::L2NormalizeHeads(Row(q, t, width), dim, kL2Eps);
    kernels::L2NormalizeHeads(Row(k, t, width), dim, kL2Eps);
    for (float& e : Row(q, t, width)) e *= q_scale;
    for (size_t h = 0; h < heads; ++h) beta[t * heads + h] = Sigmoid(beta[t * heads + h]);
    kernels::KdaDecay(Row(z, t, width), w.a_log, w.dt_bias, dim, lower_bound);  // z -> alpha
  });
  // The recurrence runs token by token on each sequence's state; heads are independent.
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (const Rows& r : rows) {
    std::span<float> s = r.state->kda_state(layer);
    for (size_t t = r.first; t < r.first + r.count; ++t) {
      tbb::parallel_for(size_t{0}, heads, [&](size_t h) {
        const size_t at = t * width + h * dim;
        std::span<float> oh(o.data() + at, dim);
        kernels::KdaStep(s.subspan(h * dim * dim, dim * dim), dim, dim, {q.data() + at, dim},
                         {k.data() + at, dim}, {v.data() + at, dim}, {z.data() + at, dim},
                         beta[t * heads + h], oh);
        kernels::RmsNorm(oh, w.o_norm, eps, oh);  // norm, then gate (KDA; MLA only gates)
        for (size_t i = 0; i < dim; ++i) oh[i] *= Sigmoid(gate[at + i]);
      });
    }
  }
  MatMul(w.o, o, tokens, out);
}

void Model::Mla(int64_t layer, const MlaWeights& w, std::span<const float> x,
                std::span<const Rows> rows, size_t tokens, const StepScratch::MlaBuffers& b,
                std::span<float> out) {
  const size_t heads = config_.num_attention_heads, nope = config_.qk_nope_head_dim,
               rope = config_.qk_rope_head_dim, vdim = config_.v_head_dim,
               latent = config_.kv_lora_rank;
  const size_t qwidth = nope + rope, kvwidth = nope + vdim, row_width = latent + rope;
  const std::span<float> cq = b.cq, q = b.q, kv = b.kv, gate = b.gate, o = b.o;
  MatMul(w.q_a, x, tokens, cq);
  NormRows(cq, tokens, w.q_a_norm, kMlaLoraEps, cq);
  MatMul(w.q_b, cq, tokens, q);
  MatMul(w.kv_a, x, tokens, kv);
  // Cache the normalised latent and the shared key part (never rotated: NoPE), each token in
  // its own sequence's cache.
  for (size_t t = 0; t < tokens; ++t) {
    std::span<float> row = Row(kv, t, row_width);
    kernels::RmsNorm(row.first(latent), w.kv_a_norm, kMlaLoraEps, row.first(latent));
  }
  std::vector<size_t> first(rows.size());  // positions in each cache before this step
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<float>& cache = rows[r].state->mla_cache(layer);
    first[r] = cache.size() / row_width;
    cache.insert(cache.end(), kv.begin() + rows[r].first * row_width,
                 kv.begin() + (rows[r].first + rows[r].count) * row_width);
  }
  if (w.g.present()) MatMul(w.g, x, tokens, gate);
  const float scale = 1.0f / std::sqrt(static_cast<float>(qwidth));
  {
    const WholeMatrix kv_b_view(w.kv_b);  // used row by row: held whole through the attention
    if (!kv_b_view.loaded()) return;      // the source keeps the error; the layer fails
    const Matrix& kv_b = kv_b_view.get();
    for (size_t t = 0; t < tokens; ++t) {
      const size_t r = RowsOf(rows, t);
      const std::vector<float>& cache = rows[r].state->mla_cache(layer);
      // Causal: itself and everything before it in its own sequence.
      const size_t positions = first[r] + (t - rows[r].first) + 1;
      tbb::parallel_for(size_t{0}, heads, [&](size_t h) {
        std::span<const float> qh(q.data() + (t * heads + h) * qwidth, qwidth);
        // Absorbed form: q_hat = W_UK^T q_nope, attend over latents, then W_UV.
        const auto head = scratch_.BorrowAttentionHead(positions);
        const std::span<float> q_hat(head->q_hat.data(), latent), ctx(head->ctx.data(), latent),
            scores(head->scores.data(), positions);
        std::fill(q_hat.begin(), q_hat.end(), 0.0f);
        for (size_t j = 0; j < nope; ++j) RowAxpy(kv_b, h * kvwidth + j, qh[j], q_hat);
        kernels::MlaAttendHead(q_hat, qh.subspan(nope, rope), cache, positions, latent, rope, scale,
                               scores, ctx);
        for (size_t i = 0; i < vdim; ++i) {
          const size_t at = (t * heads + h) * vdim + i;
          o[at] = RowDot(kv_b, h * kvwidth + nope + i, ctx);
          if (w.g.present()) o[at] *= Sigmoid(gate[at]);
        }
      });
    }
  }
  MatMul(w.o, o, tokens, out);
}

// The SiTU-gated MLP of the dense layers and of the fused shared experts.
void Model::SituMlp(const Matrix& gate_w, const Matrix& up_w, const Matrix& down_w,
                    std::span<const float> x, size_t tokens, const StepScratch::MlpBuffers& b,
                    std::span<float> out) const {
  const std::span<float> gate = b.gate.first(tokens * gate_w.rows);
  const std::span<float> up = b.up.first(tokens * up_w.rows);
  MatMul(gate_w, x, tokens, gate);
  MatMul(up_w, x, tokens, up);
  kernels::SituGlu(gate, up, gate, config_.situ_beta, config_.situ_linear_beta);
  MatMul(down_w, gate, tokens, out);
}

absl::Status Model::Layer(int64_t l, const LayerWeights& lw, std::span<const Rows> rows,
                          size_t tokens, size_t& blocks) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const std::span<float> prefix = scratch_.prefix(tokens), h = scratch_.h(tokens),
                         x = scratch_.x(tokens), branch = scratch_.branch(tokens);
  if (blocks == 0) {
    std::copy(prefix.begin(), prefix.end(), h.begin());
  } else {
    AttnRes(blocks, prefix, tokens, lw.attn_res_fold, h);
  }
  // On a boundary the old prefix is kept after serving as the last candidate above.
  const bool fresh_block = config_.is_block_boundary(l);
  if (fresh_block) {
    std::copy(prefix.begin(), prefix.end(), scratch_.snapshot(blocks++, tokens).begin());
  }
  NormRows(h, tokens, lw.input_norm, eps, x);
  const bool kda = config_.attention_kind(l) == AttentionKind::kKda;
  // The projections run on every row at once (one read of the weights); the recurrence and the
  // attention on each sequence's own state.
  if (kda) {
    Kda(l, lw.kda, x, rows, tokens, scratch_.kda(tokens), branch);
  } else {
    Mla(l, lw.mla, x, rows, tokens, scratch_.mla(tokens), branch);
  }
  if (fresh_block) {
    std::copy(branch.begin(), branch.end(), prefix.begin());
  } else {
    for (size_t i = 0; i < prefix.size(); ++i) prefix[i] += branch[i];
  }
  AttnRes(blocks, prefix, tokens, lw.mlp_res_fold, h);
  NormRows(h, tokens, lw.post_norm, eps, x);
  experts_.Lookahead(l, x, tokens);
  if (config_.is_dense(l)) {
    SituMlp(lw.dense.gate, lw.dense.up, lw.dense.down, x, tokens, scratch_.dense(tokens), branch);
  } else if (absl::Status s = Moe(l, lw.moe, x, tokens, branch); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < prefix.size(); ++i) prefix[i] += branch[i];
  return absl::OkStatus();
}

std::vector<OrderedMatrix> LayerMatrixOrder(const ModelConfig& c, const TensorNames& n, int64_t l) {
  std::vector<OrderedMatrix> order;
  auto add = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view name : names) order.push_back({n.Layer(l, name)});
  };
  // Model::Kda, Model::Mla (kv_b is used row by row between the gate and o_proj).
  if (c.attention_kind(l) == AttentionKind::kKda) {
    add({tn::kKdaQ, tn::kKdaK, tn::kKdaV, tn::kAttnGate, tn::kKdaFA, tn::kKdaFB, tn::kKdaB,
         tn::kAttnOut});
  } else {
    add({tn::kMlaQA, tn::kMlaQB, tn::kMlaKvA});
    if (c.mla_use_output_gate) add({tn::kAttnGate});
    add({tn::kMlaKvB});
    order.back().whole = true;
    add({tn::kAttnOut});
  }
  // Model::SituMlp for the dense layers; Model::Moe: router, latent down-projection, the shared
  // experts (alongside the routed ones), latent up-projection.
  if (c.is_dense(l)) {
    add({tn::kDenseGate, tn::kDenseUp, tn::kDenseDown});
    return order;
  }
  add({tn::kRouter, tn::kLatentDown});
  if (c.num_shared_experts > 0) add({tn::kSharedGate, tn::kSharedUp, tn::kSharedDown});
  add({tn::kLatentUp});
  return order;
}

absl::Status Model::Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                            std::vector<float>& logits, const LayerObserver& observer) {
  const BatchSegment one{ids, &state};
  return Run({&one, 1}, all_positions, logits, observer);
}

absl::Status Model::ForwardBatch(std::span<const BatchSegment> segments, std::vector<float>& logits,
                                 const LayerObserver& observer) {
  return Run(segments, false, logits, observer);
}

absl::Status Model::Run(std::span<const BatchSegment> segments, bool all_positions,
                        std::vector<float>& logits, const LayerObserver& observer) {
  if (segments.empty()) return absl::InvalidArgumentError("no sequences to run");
  std::vector<Rows> rows;    // of the segments still in the step
  std::vector<int32_t> ids;  // every segment's tokens, stacked
  for (size_t s = 0; s < segments.size(); ++s) {
    const BatchSegment& seg = segments[s];
    if (seg.ids.empty()) return absl::InvalidArgumentError("no tokens to run");
    for (size_t i = 0; i < seg.ids.size(); ++i) {
      if (seg.ids[i] < 0 || seg.ids[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", seg.ids[i], " at position ", i, segments.size() > 1 ? " of sequence " : "",
            segments.size() > 1 ? absl::StrCat(s) : "", " is outside the vocabulary (0..",
            config_.vocab_size - 1, ")"));
      }
    }
    for (const Rows& r : rows) {
      if (r.state == seg.state) return absl::InvalidArgumentError("two segments share a state");
    }
    rows.push_back({ids.size(), seg.ids.size(), seg.state, s, seg.cancelled});
    ids.insert(ids.end(), seg.ids.begin(), seg.ids.end());
  }
  const size_t d = config_.hidden_size;
  const size_t vocab = config_.vocab_size;
  // The residual stream per token (the running prefix P and the block snapshots B) and every
  // layer's activations live in the scratch, grown here and only here.
  scratch_.Reserve(ids.size());
  if (absl::Status s = layers_->Embed(ids, scratch_.prefix(ids.size())); !s.ok()) return s;
  size_t blocks = 0;  // snapshots taken
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    auto lw = layers_->AcquireLayer(l);
    if (!lw.ok()) return lw.status();
    absl::Status s = Layer(l, **lw, rows, ids.size(), blocks);
    layers_->ReleaseLayer(l);
    if (s.ok()) s = layers_->TakeError();
    if (!s.ok()) return s;
    layers_run_.fetch_add(1, std::memory_order_relaxed);
    if (observer) observer(l, scratch_.prefix(ids.size()));
    if (l + 1 < config_.num_layers && DropCancelled(rows, ids, scratch_, blocks, d) &&
        rows.empty()) {
      logits.assign(segments.size() * (all_positions ? segments[0].ids.size() : 1) * vocab, 0.f);
      return absl::OkStatus();
    }
  }
  const size_t tokens = ids.size();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const std::span<float> h = scratch_.h(tokens), x = scratch_.x(tokens);
  AttnRes(blocks, scratch_.prefix(tokens), tokens, trunk_.output_res_fold, h);
  NormRows(h, tokens, trunk_.final_norm, eps, x);
  if (all_positions) {
    logits.resize(tokens * vocab);
    MatMul(trunk_.lm_head, x, tokens, logits);
  } else {  // the last row of each segment, in one pass over lm_head
    const std::span<float> last = h.first(rows.size() * d);  // h is spent once normalised into x
    for (size_t r = 0; r < rows.size(); ++r) {
      const auto row = Row(std::span<const float>(x), rows[r].first + rows[r].count - 1, d);
      std::copy(row.begin(), row.end(), last.begin() + r * d);
    }
    logits.resize(segments.size() * vocab);
    MatMul(trunk_.lm_head, last, rows.size(), std::span<float>(logits).first(rows.size() * vocab));
    if (rows.size() < segments.size()) {  // each row to its segment's place; cancelled: zeros
      const std::vector<float> kept(logits.begin(), logits.begin() + rows.size() * vocab);
      std::fill(logits.begin(), logits.end(), 0.f);
      for (size_t r = 0; r < rows.size(); ++r) {
        std::copy_n(kept.begin() + r * vocab, vocab, logits.begin() + rows[r].segment * vocab);
      }
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& hear = segments[rows[r].segment].on_position_logits;
    if (hear) PositionLogits(x, rows[r], hear);
  }
  if (absl::Status s = layers_->TakeError(); !s.ok()) return s;
  for (const Rows& r : rows) r.state->AppendTokens({ids.data() + r.first, r.count});
  return absl::OkStatus();
}

void Model::PositionLogits(std::span<const float> x, const Rows& rows,
                           const std::function<void(size_t, std::span<const float>)>& hear) const {
  const size_t d = config_.hidden_size, vocab = config_.vocab_size;
  std::vector<float> block(std::min(rows.count, kPositionLogitsRows) * vocab);
  for (size_t at = 0; at < rows.count; at += kPositionLogitsRows) {
    const size_t n = std::min(kPositionLogitsRows, rows.count - at);
    MatMul(trunk_.lm_head, x.subspan((rows.first + at) * d, n * d), n,
           std::span<float>(block).first(n * vocab));
    for (size_t i = 0; i < n; ++i) {
      hear(at + i, std::span<const float>(block).subspan(i * vocab, vocab));
    }
  }
}

}  // namespace k3
