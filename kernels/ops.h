// Small fp32 vector operations. Each has a scalar twin used by the tests. Any length is allowed
// (lengths that are not a multiple of the vector width are handled), and the SIMD versions use a
// fixed accumulation order, so the same inputs always give the same bits on a given machine.
#ifndef K3_KERNELS_OPS_H_
#define K3_KERNELS_OPS_H_

#include <cstddef>
#include <span>

namespace k3::kernels {

// Rows per parallel task of a matrix product: enough work per task to amortise scheduling, fixed
// so the split does not depend on the thread count (not that it could change a row's result).
// Streamed pieces and compressed blocks of the trunk hold multiples of it, so they split into
// the same tasks.
inline constexpr size_t kMatMulRowsPerTask = 64;

// SiTU betas of Kimi K3 (MODEL.md 2.6): the gate cap and the up cap.
inline constexpr float kSituBeta1 = 4.0f;
inline constexpr float kSituBeta2 = 25.0f;

// sum_i a[i] * b[i]; a and b have the same size.
float Dot(std::span<const float> a, std::span<const float> b);
float DotScalar(std::span<const float> a, std::span<const float> b);

// y[i] += alpha * x[i]; x and y have the same size.
void Axpy(float alpha, std::span<const float> x, std::span<float> y);
void AxpyScalar(float alpha, std::span<const float> x, std::span<float> y);

// out[i] = weight[i] * x[i] / sqrt(mean(x^2) + eps), in fp32 (the epsilon is inside the square
// root). All three have the same size; out may be x (in place).
void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out);
void RmsNormScalar(std::span<const float> x, std::span<const float> weight, float eps,
                   std::span<float> out);

// SiTU-GLU: out[i] = [b1 tanh(g/b1) sigmoid(g)] * [b2 tanh(u/b2)] with g = gate[i], u = up[i];
// the sigmoid takes the uncapped g, so |out| <= b1 * b2. out may be gate or up (in place).
void SituGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out,
             float beta1 = kSituBeta1, float beta2 = kSituBeta2);
void SituGluScalar(std::span<const float> gate, std::span<const float> up, std::span<float> out,
                   float beta1 = kSituBeta1, float beta2 = kSituBeta2);

}  // namespace k3::kernels

#endif  // K3_KERNELS_OPS_H_
