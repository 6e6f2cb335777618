// The small per-token operations of the Kimi K3 forward pass (MODEL.md section 2) that are not
// matrix products: short convolution, L2 norm, the KDA recurrent step, MLA attention over the
// absorbed latent cache, the AttnRes aggregator and router top-k. Plain C++ with a fixed order
// of every reduction (no SIMD variant, so these are their own scalar twins); the compiler may
// vectorise the element-wise loops, which never changes a result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace k3::kernels {

// Y = X W^T for an fp32 matrix W [rows, cols] (row-major), X [tokens, cols], Y [tokens, rows];
// only columns [row_begin, row_end) of Y are written. Token t's results equal the tokens = 1
// call on X[t] bit for bit.
struct F32Matrix {
  std::span<const float> data;
  size_t rows = 0;
  size_t cols = 0;
};
void F32MatMul(const F32Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
               size_t row_begin, size_t row_end);

float Sigmoid(float x);
float Silu(float x);

// Depthwise causal convolution over `tokens` rows of `channels` values, then SiLU:
// y[t, c] = SiLU(sum_j w[c, j] * x[t - (K-1) + j, c]), tap K-1 on the current token. `history`
// holds the last K-1 pre-convolution inputs ([K-1, channels], oldest first; zeros at the start
// of a sequence) and is advanced past the new tokens.
void ShortConvSilu(std::span<const float> x, size_t tokens, size_t channels,
                   std::span<const float> weight, size_t kernel, std::span<float> history,
                   std::span<float> y);

// Per head of `dim` values: v <- v / sqrt(sum(v^2) + eps) (epsilon on the sum, not the mean).
void L2NormalizeHeads(std::span<float> x, size_t dim, float eps);

// KDA decay (MODEL.md 2.4 step 6): alpha[c] = exp(lower_bound * sigmoid(exp(a_log[h]) *
// (z[c] + dt_bias[c]))) with h = c / dim: A_log per head, dt_bias per channel, the bias added
// before the exp(A) scale, the lower bound multiplying the sigmoid. In place over z.
void KdaDecay(std::span<float> z, std::span<const float> a_log, std::span<const float> dt_bias,
              size_t dim, float lower_bound);

// One KDA delta-rule step for one head (MODEL.md 2.4 step 7), state S [dk, dv] row-major:
// S' = Diag(alpha) S; u = S'^T k; S = S' + beta k (v - u)^T; o = S^T q (the updated state).
void KdaStep(std::span<float> state, size_t dk, size_t dv, std::span<const float> q,
             std::span<const float> k, std::span<const float> v, std::span<const float> alpha,
             float beta, std::span<float> o);

// MLA attention of one head over positions [0, positions): scores
// s_p = (q_latent . latent[p] + q_rope . rope[p]) * scale, softmax in fp32 (max subtracted),
// ctx = sum_p softmax_p * latent[p]. The cache rows are [latent_dim + rope_dim] wide.
void MlaAttendHead(std::span<const float> q_latent, std::span<const float> q_rope,
                   std::span<const float> cache, size_t positions, size_t latent_dim,
                   size_t rope_dim, float scale, std::span<float> scores, std::span<float> ctx);

// AttnRes (MODEL.md 2.2): scores s_i = sum_d fold_d v_{i,d} / sqrt(mean_d v_{i,d}^2 + eps) with
// fold = norm weight * projection, softmax over the candidates, out = sum_i pi_i v_i over the
// raw candidates. `candidates` are pointers to vectors of fold.size() floats.
void AttnResMix(std::span<const float* const> candidates, std::span<const float> fold, float eps,
                std::span<float> out);

// Router selection (MODEL.md 2.6 and 0 Q10): top-k of sigmoid(logit) + bias, ties to the lower
// index, returned in descending biased score; weights from the unbiased scores, renormalised
// with +1e-20 when `renormalize`, times `scaling`.
struct RoutedExpert {
  int32_t expert;
  float weight;
};
void RouteTopK(std::span<const float> logits, std::span<const float> bias, size_t k,
               bool renormalize, float scaling, std::vector<RoutedExpert>& out);

}  // namespace k3::kernels
