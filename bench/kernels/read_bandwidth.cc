#include "bench/kernels/read_bandwidth.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/kernels/read_bandwidth.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace k3::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

// Eight independent accumulators: the adds never limit the loop, only the loads do.
float SumImpl(const float* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  size_t i = 0;
  for (; i + 8 * lanes <= n; i += 8 * lanes) {
    a0 = hn::Add(a0, hn::LoadU(d, p + i));
    a1 = hn::Add(a1, hn::LoadU(d, p + i + lanes));
    a2 = hn::Add(a2, hn::LoadU(d, p + i + 2 * lanes));
    a3 = hn::Add(a3, hn::LoadU(d, p + i + 3 * lanes));
    a4 = hn::Add(a4, hn::LoadU(d, p + i + 4 * lanes));
    a5 = hn::Add(a5, hn::LoadU(d, p + i + 5 * lanes));
    a6 = hn::Add(a6, hn::LoadU(d, p + i + 6 * lanes));
    a7 = hn::Add(a7, hn::LoadU(d, p + i + 7 * lanes));
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += p[i];
  const auto sum =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  return hn::GetLane(hn::SumOfLanes(d, sum)) + tail;
}

}  // namespace
}  // namespace k3::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::bench {

HWY_EXPORT(SumImpl);

float SumFloats(const float* p, size_t n) { return HWY_DYNAMIC_DISPATCH(SumImpl)(p, n); }

}  // namespace k3::bench
#endif  // HWY_ONCE
