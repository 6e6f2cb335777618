// The trunk's weights in memory (everything but routed experts), as views the kernels take.
// BF16 matrices stay BF16; F16 ones are widened to F32 once at load (exactly); small vectors
// are held as fp32.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"

namespace k3 {

// A row-major matrix [rows, cols] of BF16 or F32 values.
struct Matrix {
  DType dtype = DType::kBF16;
  const void* data = nullptr;
  size_t rows = 0;
  size_t cols = 0;
};

// Y[t, r] = sum_k W[r, k] X[t, k] for rows [row_begin, row_end) of every token; single-threaded.
void MatMulRows(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end);
// The whole product, rows split across threads in fixed blocks (a row's arithmetic never
// depends on the split, so neither does the result).
void MatMul(const Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y);
// Dot product of row `row` with x; y += alpha * row.
float RowDot(const Matrix& w, size_t row, std::span<const float> x);
void RowAxpy(const Matrix& w, size_t row, float alpha, std::span<float> y);
// Row `row` widened to fp32.
void RowToFloat(const Matrix& w, size_t row, std::span<float> out);

struct KdaWeights {
  Matrix q, k, v, f_a, f_b, b, g, o;
  std::vector<float> q_conv, k_conv, v_conv;  // [channels, kernel]
  std::vector<float> a_log, dt_bias, o_norm;
};

struct MlaWeights {
  Matrix q_a, q_b, kv_a, kv_b, g, o;
  std::vector<float> q_a_norm, kv_a_norm;
};

struct DenseFfnWeights {
  Matrix gate, up, down;
};

struct MoeWeights {
  Matrix router, latent_down, latent_up, shared_gate, shared_up, shared_down;
  std::vector<float> router_bias, latent_norm;
};

struct LayerWeights {
  std::vector<float> input_norm, post_norm;
  // AttnRes: norm weight times projection, folded once (MODEL.md 2.2).
  std::vector<float> attn_res_fold, mlp_res_fold;
  KdaWeights kda;         // KDA layers
  MlaWeights mla;         // MLA layers
  DenseFfnWeights dense;  // the first_k_dense_replace layers
  MoeWeights moe;         // the others
};

struct TrunkWeights {
  Matrix embed, lm_head;
  std::vector<float> final_norm, output_res_fold;
  std::vector<LayerWeights> layers;
  // Per layer: all its weights are here. Otherwise only its router (lookahead needs every
  // router) and the pipeline streams the rest (LoadLayerWeights).
  std::vector<bool> resident;
  // Owns the bytes the matrices point into.
  std::vector<std::vector<uint8_t>> storage;
  uint64_t bytes = 0;
};

// Where a tensor's stored bytes come from: read into `owned` (which the weights then keep), or a
// view of memory that outlives the weights (a streaming ring slot).
using TensorBytesFn = std::function<absl::StatusOr<std::span<const uint8_t>>(
    const TensorInfo& tensor, std::vector<uint8_t>& owned)>;
TensorBytesFn ReadFromCheckpoint(const Checkpoint& ckpt);

// Reads the global tensors, every router, and every other tensor of the layers where
// pinned[l] (all layers when `pinned` is null). `progress(done, total)` reports bytes.
absl::StatusOr<std::unique_ptr<TrunkWeights>> LoadTrunkWeights(
    const Checkpoint& ckpt, const std::function<void(uint64_t, uint64_t)>& progress = {},
    const std::vector<bool>* pinned = nullptr);

// Builds everything of one layer but its router from `source` into `out`; F16 matrices and
// copies go to `storage`. Returns the bytes the weights take.
absl::StatusOr<uint64_t> LoadLayerWeights(const Checkpoint& ckpt, int64_t layer,
                                          const TensorBytesFn& source, LayerWeights& out,
                                          std::vector<std::vector<uint8_t>>& storage);

}  // namespace k3
