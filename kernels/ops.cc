#include "kernels/ops.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h (it is a per-target header).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// Internal linkage: the per-target helpers of different files share a namespace.
namespace {

using DO = hn::ScalableTag<float>;
using VO = hn::Vec<DO>;
inline constexpr size_t kOpLanes = hn::MaxLanes(DO());

// The last n < kOpLanes values, zero-padded.
HWY_INLINE VO LoadTail(const float* HWY_RESTRICT p, size_t n) {
  alignas(64) float buf[kOpLanes] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(DO(), buf);
}

HWY_INLINE void StoreTail(VO v, float* HWY_RESTRICT p, size_t n) {
  alignas(64) float buf[kOpLanes];
  hn::Store(v, DO(), buf);
  std::memcpy(p, buf, n * sizeof(float));
}

// Fixed order: four accumulators over blocks of four vectors, leftover whole vectors into the
// first, the zero-padded tail into the second, then (a0 + a1) + (a2 + a3) and a lane reduction.
float DotImpl(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n) {
  const DO d;
  const size_t lanes = hn::Lanes(d);
  VO a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), a0);
    a1 = hn::MulAdd(hn::LoadU(d, a + i + lanes), hn::LoadU(d, b + i + lanes), a1);
    a2 = hn::MulAdd(hn::LoadU(d, a + i + 2 * lanes), hn::LoadU(d, b + i + 2 * lanes), a2);
    a3 = hn::MulAdd(hn::LoadU(d, a + i + 3 * lanes), hn::LoadU(d, b + i + 3 * lanes), a3);
  }
  for (; i + lanes <= n; i += lanes) a0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), a0);
  if (i < n) a1 = hn::MulAdd(LoadTail(a + i, n - i), LoadTail(b + i, n - i), a1);
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
}

void AxpyImpl(float alpha, const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t n) {
  const DO d;
  const size_t lanes = hn::Lanes(d);
  const VO va = hn::Set(d, alpha);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  }
  if (i < n)
    StoreTail(hn::MulAdd(va, LoadTail(x + i, n - i), LoadTail(y + i, n - i)), y + i, n - i);
}

// out may alias x: each element is read before it is written.
void RmsNormImpl(const float* x, const float* HWY_RESTRICT weight, float eps, float* out,
                 size_t n) {
  const DO d;
  const size_t lanes = hn::Lanes(d);
  const float sum_sq = DotImpl(x, x, n);
  const VO inv = hn::Set(d, 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps));
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), inv), hn::LoadU(d, weight + i)), d, out + i);
  }
  if (i < n) {
    StoreTail(hn::Mul(hn::Mul(LoadTail(x + i, n - i), inv), LoadTail(weight + i, n - i)), out + i,
              n - i);
  }
}

HWY_INLINE VO Situ(VO g, VO u, VO b1, VO b2) {
  const DO d;
  const VO one = hn::Set(d, 1.0f);
  const VO gate_cap = hn::Mul(b1, hn::CallTanh(d, hn::Div(g, b1)));
  // exp(-g) overflows below g = -88.7 and the sigmoid is then below 1e-38: clamping keeps the
  // exponential in Highway's valid range and changes the product by less than 1e-37.
  const VO e = hn::CallExp(d, hn::Min(hn::Neg(g), hn::Set(d, 88.0f)));
  const VO sigmoid = hn::Div(one, hn::Add(one, e));
  const VO up_cap = hn::Mul(b2, hn::CallTanh(d, hn::Div(u, b2)));
  return hn::Mul(hn::Mul(gate_cap, sigmoid), up_cap);
}

void SituImpl(const float* gate, const float* up, float* out, size_t n, float beta1, float beta2) {
  const DO d;
  const size_t lanes = hn::Lanes(d);
  const VO b1 = hn::Set(d, beta1);
  const VO b2 = hn::Set(d, beta2);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(Situ(hn::LoadU(d, gate + i), hn::LoadU(d, up + i), b1, b2), d, out + i);
  }
  if (i < n)
    StoreTail(Situ(LoadTail(gate + i, n - i), LoadTail(up + i, n - i), b1, b2), out + i, n - i);
}

}  // namespace
}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::kernels {

HWY_EXPORT(DotImpl);
HWY_EXPORT(AxpyImpl);
HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(SituImpl);

namespace {

void CheckSameSize(size_t a, size_t b, const char* fn) {
  if (a != b) throw std::invalid_argument(std::string("k3::kernels::") + fn + ": size mismatch");
}

}  // namespace

float Dot(std::span<const float> a, std::span<const float> b) {
  CheckSameSize(a.size(), b.size(), "Dot");
  return HWY_DYNAMIC_DISPATCH(DotImpl)(a.data(), b.data(), a.size());
}

float DotScalar(std::span<const float> a, std::span<const float> b) {
  CheckSameSize(a.size(), b.size(), "DotScalar");
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

void Axpy(float alpha, std::span<const float> x, std::span<float> y) {
  CheckSameSize(x.size(), y.size(), "Axpy");
  HWY_DYNAMIC_DISPATCH(AxpyImpl)(alpha, x.data(), y.data(), x.size());
}

void AxpyScalar(float alpha, std::span<const float> x, std::span<float> y) {
  CheckSameSize(x.size(), y.size(), "AxpyScalar");
  for (size_t i = 0; i < x.size(); ++i) y[i] += alpha * x[i];
}

void RmsNorm(std::span<const float> x, std::span<const float> weight, float eps,
             std::span<float> out) {
  CheckSameSize(x.size(), weight.size(), "RmsNorm");
  CheckSameSize(x.size(), out.size(), "RmsNorm");
  if (x.empty()) return;
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x.data(), weight.data(), eps, out.data(), x.size());
}

void RmsNormScalar(std::span<const float> x, std::span<const float> weight, float eps,
                   std::span<float> out) {
  CheckSameSize(x.size(), weight.size(), "RmsNormScalar");
  CheckSameSize(x.size(), out.size(), "RmsNormScalar");
  if (x.empty()) return;
  double sum_sq = 0.0;
  for (float v : x) sum_sq += static_cast<double>(v) * v;
  const float inv =
      static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(x.size()) + eps));
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * weight[i];
}

void SituGlu(std::span<const float> gate, std::span<const float> up, std::span<float> out,
             float beta1, float beta2) {
  CheckSameSize(gate.size(), up.size(), "SituGlu");
  CheckSameSize(gate.size(), out.size(), "SituGlu");
  HWY_DYNAMIC_DISPATCH(SituImpl)(gate.data(), up.data(), out.data(), gate.size(), beta1, beta2);
}

void SituGluScalar(std::span<const float> gate, std::span<const float> up, std::span<float> out,
                   float beta1, float beta2) {
  CheckSameSize(gate.size(), up.size(), "SituGluScalar");
  CheckSameSize(gate.size(), out.size(), "SituGluScalar");
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = gate[i];
    const float u = up[i];
    const float sigmoid = 1.0f / (1.0f + std::exp(-g));
    out[i] = (beta1 * std::tanh(g / beta1) * sigmoid) * (beta2 * std::tanh(u / beta2));
  }
}

}  // namespace k3::kernels
#endif  // HWY_ONCE
