#include "core/model/weights.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/numeric.h"
#include "kernels/bf16.h"
#include "kernels/model_ops.h"
#include "kernels/ops.h"

namespace k3 {
namespace {

// Rows per parallel task: enough work per task to amortise scheduling, fixed so the split does
// not depend on the thread count (not that it could change a row's result).
constexpr size_t kRowsPerTask = 64;

kernels::Bf16Matrix AsBf16(const Matrix& w) {
  return {{static_cast<const uint16_t*>(w.data), w.rows * w.cols}, w.rows, w.cols};
}
kernels::F32Matrix AsF32(const Matrix& w) {
  return {{static_cast<const float*>(w.data), w.rows * w.cols}, w.rows, w.cols};
}

}  // namespace

void MatMulRows(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end) {
  if (w.dtype == DType::kBF16) {
    kernels::Bf16MatMul(AsBf16(w), x, tokens, y, row_begin, row_end);
  } else {
    kernels::F32MatMul(AsF32(w), x, tokens, y, row_begin, row_end);
  }
}

void MatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y) {
  tbb::parallel_for(
      tbb::blocked_range<size_t>(0, w.rows, kRowsPerTask),
      [&](const tbb::blocked_range<size_t>& r) { MatMulRows(w, x, tokens, y, r.begin(), r.end()); },
      tbb::simple_partitioner());
}

void RowToFloat(const Matrix& w, size_t row, std::span<float> out) {
  if (w.dtype == DType::kBF16) {
    kernels::Bf16ToF32({static_cast<const uint16_t*>(w.data) + row * w.cols, w.cols}, out);
  } else {
    std::memcpy(out.data(), static_cast<const float*>(w.data) + row * w.cols, w.cols * 4);
  }
}

float RowDot(const Matrix& w, size_t row, std::span<const float> x) {
  if (w.dtype == DType::kF32) {
    return kernels::Dot({static_cast<const float*>(w.data) + row * w.cols, w.cols}, x);
  }
  thread_local std::vector<float> buf;
  buf.resize(w.cols);
  RowToFloat(w, row, buf);
  return kernels::Dot(buf, x);
}

void RowAxpy(const Matrix& w, size_t row, float alpha, std::span<float> y) {
  if (w.dtype == DType::kF32) {
    kernels::Axpy(alpha, {static_cast<const float*>(w.data) + row * w.cols, w.cols}, y);
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize(w.cols);
  RowToFloat(w, row, buf);
  kernels::Axpy(alpha, buf, y);
}

namespace {

class TrunkLoader {
 public:
  TrunkLoader(const Checkpoint& ckpt, TrunkWeights& out,
              const std::function<void(uint64_t, uint64_t)>& progress)
      : ckpt_(ckpt), out_(out), progress_(progress) {
    for (const TensorSpec& spec : TrunkTensorSpecs(ckpt.config(), ckpt.names())) {
      total_ += ckpt.Find(spec.name)->byte_size;
    }
  }

  absl::Status status() const { return status_; }

  // A matrix: BF16 and F32 kept as stored, F16 widened to F32.
  Matrix Mat(const std::string& name) {
    const TensorInfo* t = Find(name);
    if (t == nullptr) return {};
    std::vector<uint8_t> bytes(t->byte_size);
    Check(ckpt_.ReadTensor(*t, bytes));
    Matrix m{t->dtype, nullptr, static_cast<size_t>(t->shape[0]),
             static_cast<size_t>(t->elements() / t->shape[0])};
    if (t->dtype == DType::kF16) {
      std::vector<uint8_t> wide(t->elements() * 4);
      for (int64_t i = 0; i < t->elements(); ++i) {
        float f = HalfToFloat(static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
        std::memcpy(&wide[4 * i], &f, 4);
      }
      bytes = std::move(wide);
      m.dtype = DType::kF32;
    }
    m.data = bytes.data();
    out_.bytes += bytes.size();
    out_.storage.push_back(std::move(bytes));
    return m;
  }

  std::vector<float> Vec(const std::string& name) {
    const TensorInfo* t = Find(name);
    if (t == nullptr) return {};
    auto v = ckpt_.ReadTensorAsFloat(*t);
    Check(v.status());
    if (!v.ok()) return {};
    out_.bytes += v->size() * 4;
    return *std::move(v);
  }

  // Norm weight times projection (AttnRes keys, MODEL.md 2.2).
  std::vector<float> Fold(const std::string& norm, const std::string& proj) {
    std::vector<float> g = Vec(norm), w = Vec(proj);
    for (size_t i = 0; i < g.size() && i < w.size(); ++i) g[i] *= w[i];
    return g;
  }

 private:
  const TensorInfo* Find(const std::string& name) {
    const TensorInfo* t = ckpt_.Find(name);
    if (t == nullptr) Check(absl::NotFoundError(absl::StrCat("tensor ", name, " is missing")));
    if (t != nullptr && progress_) progress_(done_ += t->byte_size, total_);
    return t;
  }
  void Check(const absl::Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }

  const Checkpoint& ckpt_;
  TrunkWeights& out_;
  const std::function<void(uint64_t, uint64_t)>& progress_;
  absl::Status status_;
  uint64_t total_ = 0;
  uint64_t done_ = 0;
};

void LoadAttention(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
                   LayerWeights& lw) {
  auto name = [&](const char* suffix) { return n.Layer(l, absl::StrCat("self_attn.", suffix)); };
  if (c.attention_kind(l) == AttentionKind::kKda) {
    KdaWeights& k = lw.kda;
    k.q = ld.Mat(name("q_proj.weight"));
    k.k = ld.Mat(name("k_proj.weight"));
    k.v = ld.Mat(name("v_proj.weight"));
    k.f_a = ld.Mat(name("f_a_proj.weight"));
    k.f_b = ld.Mat(name("f_b_proj.weight"));
    k.b = ld.Mat(name("b_proj.weight"));
    k.g = ld.Mat(name("g_proj.weight"));
    k.o = ld.Mat(name("o_proj.weight"));
    k.q_conv = ld.Vec(name("q_conv1d.weight"));
    k.k_conv = ld.Vec(name("k_conv1d.weight"));
    k.v_conv = ld.Vec(name("v_conv1d.weight"));
    k.a_log = ld.Vec(name("A_log"));
    k.a_log.resize(c.kda_num_heads);  // the release ships head_dim entries; one per head is used
    k.dt_bias = ld.Vec(name("dt_bias"));
    k.o_norm = ld.Vec(name("o_norm.weight"));
  } else {
    MlaWeights& m = lw.mla;
    m.q_a = ld.Mat(name("q_a_proj.weight"));
    m.q_b = ld.Mat(name("q_b_proj.weight"));
    m.kv_a = ld.Mat(name("kv_a_proj_with_mqa.weight"));
    m.kv_b = ld.Mat(name("kv_b_proj.weight"));
    if (c.mla_use_output_gate) m.g = ld.Mat(name("g_proj.weight"));
    m.o = ld.Mat(name("o_proj.weight"));
    m.q_a_norm = ld.Vec(name("q_a_layernorm.weight"));
    m.kv_a_norm = ld.Vec(name("kv_a_layernorm.weight"));
  }
}

void LoadFfn(const ModelConfig& c, int64_t l, const TensorNames& n, TrunkLoader& ld,
             LayerWeights& lw) {
  if (c.is_dense(l)) {
    lw.dense.gate = ld.Mat(n.Layer(l, "mlp.gate_proj.weight"));
    lw.dense.up = ld.Mat(n.Layer(l, "mlp.up_proj.weight"));
    lw.dense.down = ld.Mat(n.Layer(l, "mlp.down_proj.weight"));
    return;
  }
  auto name = [&](const char* suffix) {
    return n.Layer(l, absl::StrCat("block_sparse_moe.", suffix));
  };
  MoeWeights& m = lw.moe;
  m.router = ld.Mat(name("gate.weight"));
  m.router_bias = ld.Vec(name("gate.e_score_correction_bias"));
  m.latent_down = ld.Mat(name("routed_expert_down_proj.weight"));
  m.latent_norm = ld.Vec(name("routed_expert_norm.weight"));
  m.latent_up = ld.Mat(name("routed_expert_up_proj.weight"));
  if (c.num_shared_experts > 0) {
    m.shared_gate = ld.Mat(name("shared_experts.gate_proj.weight"));
    m.shared_up = ld.Mat(name("shared_experts.up_proj.weight"));
    m.shared_down = ld.Mat(name("shared_experts.down_proj.weight"));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrunkWeights>> LoadTrunkWeights(
    const Checkpoint& ckpt, const std::function<void(uint64_t, uint64_t)>& progress) {
  const ModelConfig& c = ckpt.config();
  const TensorNames& n = ckpt.names();
  auto out = std::make_unique<TrunkWeights>();
  TrunkLoader ld(ckpt, *out, progress);
  out->embed = ld.Mat(n.Global("model.embed_tokens.weight"));
  out->lm_head = ld.Mat(n.Global("lm_head.weight"));
  out->final_norm = ld.Vec(n.Global("model.norm.weight"));
  out->output_res_fold = ld.Fold(n.Global("model.output_attn_res_norm.weight"),
                                 n.Global("model.output_attn_res_proj.weight"));
  out->layers.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& lw = out->layers[l];
    lw.input_norm = ld.Vec(n.Layer(l, "input_layernorm.weight"));
    lw.post_norm = ld.Vec(n.Layer(l, "post_attention_layernorm.weight"));
    lw.attn_res_fold = ld.Fold(n.Layer(l, "self_attention_res_norm.weight"),
                               n.Layer(l, "self_attention_res_proj.weight"));
    lw.mlp_res_fold = ld.Fold(n.Layer(l, "mlp_res_norm.weight"), n.Layer(l, "mlp_res_proj.weight"));
    LoadAttention(c, l, n, ld, lw);
    LoadFfn(c, l, n, ld, lw);
  }
  if (!ld.status().ok()) return ld.status();
  return out;
}

}  // namespace k3
