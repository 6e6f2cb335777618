// Shared helpers of the kernel tests: a fixture that runs a test once per SIMD target the CPU
// supports, deterministic random data, and error bounds.
#ifndef K3_TESTS_KERNELS_TEST_UTIL_H_
#define K3_TESTS_KERNELS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"

namespace k3::kernels::testing {

// Runs each test with the kernels forced to one target (AVX3, AVX2, SSE4, SSSE3, scalar ...).
class PerTarget : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { ForceKernelTarget(GetParam()); }
  void TearDown() override { ForceKernelTarget(0); }
};

inline std::string TargetParamName(const ::testing::TestParamInfo<int64_t>& info) {
  return std::string(KernelTargetName(info.param));
}

#define K3_INSTANTIATE_PER_TARGET(suite)                                                 \
  INSTANTIATE_TEST_SUITE_P(Targets, suite,                                               \
                           ::testing::ValuesIn(::k3::kernels::AvailableKernelTargets()), \
                           ::k3::kernels::testing::TargetParamName)

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed, int lo = 0, int hi = 255) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(dist(rng));
  return v;
}

// Bound on the rounding error of an fp32 dot product of n terms accumulated in any order with
// fused or unfused multiply-adds: (n + 1) * 2^-24 * sum |w_k x_k| (standard forward bound,
// taken with n = number of terms so it holds for every SIMD width), plus slack for subnormals.
inline double DotErrorBound(size_t n, double sum_abs) {
  return (static_cast<double>(n) + 1.0) * std::ldexp(1.0, -24) * sum_abs + 1e-37;
}

inline bool SameBits(float a, float b) {
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

}  // namespace k3::kernels::testing

#endif  // K3_TESTS_KERNELS_TEST_UTIL_H_
