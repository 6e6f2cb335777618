#include "kernels/model_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"

namespace k3::kernels {

void F32MatMul(const F32Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
               size_t row_begin, size_t row_end) {
  for (size_t t = 0; t < tokens; ++t) {
    std::span<const float> xt = x.subspan(t * w.cols, w.cols);
    for (size_t r = row_begin; r < row_end; ++r) {
      y[t * w.rows + r] = Dot(w.data.subspan(r * w.cols, w.cols), xt);
    }
  }
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float Silu(float x) { return x * Sigmoid(x); }

void ShortConvSilu(std::span<const float> x, size_t tokens, size_t channels,
                   std::span<const float> weight, size_t kernel, std::span<float> history,
                   std::span<float> y) {
  const size_t past = kernel - 1;
  // Input row i of the window: history rows first, then the new tokens.
  auto input = [&](size_t i, size_t c) {
    return i < past ? history[i * channels + c] : x[(i - past) * channels + c];
  };
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (size_t j = 0; j < kernel; ++j) acc += weight[c * kernel + j] * input(t + j, c);
      y[t * channels + c] = Silu(acc);
    }
  }
  // Keep the last K-1 inputs (of history followed by x).
  std::vector<float> next(past * channels);
  for (size_t i = 0; i < past; ++i) {
    for (size_t c = 0; c < channels; ++c) next[i * channels + c] = input(tokens + i, c);
  }
  std::copy(next.begin(), next.end(), history.begin());
}

void L2NormalizeHeads(std::span<float> x, size_t dim, float eps) {
  for (size_t h = 0; h + dim <= x.size(); h += dim) {
    std::span<float> head = x.subspan(h, dim);
    float sum = 0.0f;
    for (float v : head) sum += v * v;
    const float inv = 1.0f / std::sqrt(sum + eps);
    for (float& v : head) v *= inv;
  }
}

void KdaDecay(std::span<float> z, std::span<const float> a_log, std::span<const float> dt_bias,
              size_t dim, float lower_bound) {
  for (size_t c = 0; c < z.size(); ++c) {
    const float scale = std::exp(a_log[c / dim]);
    z[c] = std::exp(lower_bound * Sigmoid(scale * (z[c] + dt_bias[c])));
  }
}

void KdaStep(std::span<float> state, size_t dk, size_t dv, std::span<const float> q,
             std::span<const float> k, std::span<const float> v, std::span<const float> alpha,
             float beta, std::span<float> o) {
  std::vector<float> u(dv, 0.0f);
  for (size_t i = 0; i < dk; ++i) {  // decay rows, and u = S'^T k, in one pass over S
    float* row = &state[i * dv];
    for (size_t j = 0; j < dv; ++j) {
      row[j] *= alpha[i];
      u[j] += row[j] * k[i];
    }
  }
  for (size_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
  std::fill(o.begin(), o.end(), 0.0f);
  for (size_t i = 0; i < dk; ++i) {  // rank-1 update, then o = S^T q from the updated state
    float* row = &state[i * dv];
    for (size_t j = 0; j < dv; ++j) {
      row[j] += k[i] * u[j];
      o[j] += row[j] * q[i];
    }
  }
}

void MlaAttendHead(std::span<const float> q_latent, std::span<const float> q_rope,
                   std::span<const float> cache, size_t positions, size_t latent_dim,
                   size_t rope_dim, float scale, std::span<float> scores, std::span<float> ctx) {
  const size_t width = latent_dim + rope_dim;
  float max_score = -INFINITY;
  for (size_t p = 0; p < positions; ++p) {
    const float* row = &cache[p * width];
    float s = Dot(q_latent, {row, latent_dim});
    if (rope_dim > 0) s += Dot(q_rope, {row + latent_dim, rope_dim});
    scores[p] = s * scale;
    max_score = std::max(max_score, scores[p]);
  }
  float sum = 0.0f;
  for (size_t p = 0; p < positions; ++p) {
    scores[p] = std::exp(scores[p] - max_score);
    sum += scores[p];
  }
  std::fill(ctx.begin(), ctx.end(), 0.0f);
  const float inv = 1.0f / sum;
  for (size_t p = 0; p < positions; ++p) {
    Axpy(scores[p] * inv, cache.subspan(p * width, latent_dim), ctx);
  }
}

void AttnResMix(std::span<const float* const> candidates, std::span<const float> fold, float eps,
                std::span<float> out) {
  const size_t d = fold.size();
  std::vector<float> scores(candidates.size());
  float max_score = -INFINITY;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::span<const float> v(candidates[i], d);
    const float ms = Dot(v, v) / static_cast<float>(d);
    scores[i] = Dot(fold, v) / std::sqrt(ms + eps);
    max_score = std::max(max_score, scores[i]);
  }
  float sum = 0.0f;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    sum += s;
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t i = 0; i < candidates.size(); ++i) {
    Axpy(scores[i] / sum, {candidates[i], d}, out);
  }
}

void RouteTopK(std::span<const float> logits, std::span<const float> bias, size_t k,
               bool renormalize, float scaling, std::vector<RoutedExpert>& out) {
  const size_t n = logits.size();
  std::vector<float> score(n), biased(n);
  for (size_t e = 0; e < n; ++e) {
    score[e] = Sigmoid(logits[e]);
    biased[e] = score[e] + bias[e];
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Descending biased score; equal scores keep the lower index first.
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
  });
  float sum = 0.0f;
  for (size_t j = 0; j < k; ++j) sum += score[order[j]];
  const float denom = renormalize ? sum + 1e-20f : 1.0f;
  out.clear();
  for (size_t j = 0; j < k; ++j) {
    out.push_back({order[j], score[order[j]] / denom * scaling});
  }
}

}  // namespace k3::kernels
