#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/kernels/test_util.h"

namespace k3::kernels {
namespace {

using testing::DotErrorBound;
using testing::PerTarget;
using testing::RandomFloats;

// Lengths around every vector width, plus real widths.
const size_t kLengths[] = {0, 1, 3, 4, 5, 15, 16, 17, 31, 63, 64, 65, 100, 3072, 7168};

class Ops : public PerTarget {};

TEST_P(Ops, DotMatchesScalar) {
  for (size_t n : kLengths) {
    const std::vector<float> a = RandomFloats(n, 1 + n), b = RandomFloats(n, 2 + n, -3.0f, 3.0f);
    double abs_sum = 0;
    for (size_t i = 0; i < n; ++i) abs_sum += std::abs(double{a[i]} * b[i]);
    EXPECT_NEAR(Dot(a, b), DotScalar(a, b), DotErrorBound(n, abs_sum)) << n;
    EXPECT_EQ(Dot(a, b), Dot(a, b)) << "not deterministic at n = " << n;
  }
}

TEST_P(Ops, AxpyMatchesScalar) {
  for (size_t n : kLengths) {
    const std::vector<float> x = RandomFloats(n, 3 + n);
    std::vector<float> y = RandomFloats(n, 4 + n), y_ref = y;
    Axpy(-0.375f, x, y);
    AxpyScalar(-0.375f, x, y_ref);
    for (size_t i = 0; i < n; ++i) {
      // One rounding (fused) versus two: at most an ulp of each term apart.
      const float tol = 2 * std::numeric_limits<float>::epsilon() *
                        (std::abs(0.375f * x[i]) + std::abs(y_ref[i]) + 1e-30f);
      ASSERT_NEAR(y[i], y_ref[i], tol) << "n " << n << " i " << i;
    }
  }
}

TEST_P(Ops, RmsNormMatchesScalar) {
  for (size_t n : kLengths) {
    if (n == 0) continue;
    const std::vector<float> x = RandomFloats(n, 5 + n, -20.0f, 20.0f);
    const std::vector<float> w = RandomFloats(n, 6 + n, 0.5f, 1.5f);
    std::vector<float> got(n), want(n);
    RmsNorm(x, w, 1e-5f, got);
    RmsNormScalar(x, w, 1e-5f, want);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * (std::abs(want[i]) + 1e-6f)) << "n " << n << " i " << i;
    }
    std::vector<float> in_place = x;
    RmsNorm(in_place, w, 1e-5f, in_place);
    EXPECT_EQ(in_place, got);
  }
}

// The epsilon sits inside the square root: x = c everywhere gives c / sqrt(c^2 + eps).
TEST_P(Ops, RmsNormEpsilonInsideSqrt) {
  const float c = 1e-3f, eps = 1e-6f;
  const std::vector<float> x(37, c), w(37, 1.0f);
  std::vector<float> out(37);
  RmsNorm(x, w, eps, out);
  const double want = c / std::sqrt(double{c} * c + eps);  // 0.7071..., not 1
  for (float v : out) EXPECT_NEAR(v, want, 1e-6);
  std::vector<float> zeros(19, 0.0f), zout(19, 5.0f);
  RmsNorm(zeros, std::vector<float>(19, 1.0f), eps, zout);
  for (float v : zout) EXPECT_EQ(v, 0.0f);
}

TEST_P(Ops, SituMatchesScalar) {
  for (size_t n : kLengths) {
    const std::vector<float> g = RandomFloats(n, 7 + n, -40.0f, 40.0f);
    const std::vector<float> u = RandomFloats(n, 8 + n, -120.0f, 120.0f);
    std::vector<float> got(n), want(n);
    SituGlu(g, u, got);
    SituGluScalar(g, u, want);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5f * std::abs(want[i]) + 1e-6f)
          << "g " << g[i] << " u " << u[i];
    }
  }
}

// Inputs that saturate both caps, huge magnitudes and the sigmoid's tails; |a| <= 100.
TEST_P(Ops, SituSaturatesAtTheCaps) {
  const float big = std::numeric_limits<float>::max();
  std::vector<float> g, u;
  for (float gv : {-big, -1e30f, -1000.0f, -100.0f, -89.0f, -88.0f, -20.0f, -4.0f, -1e-30f, 0.0f,
                   1e-30f, 0.5f, 4.0f, 20.0f, 88.0f, 100.0f, 1000.0f, 1e30f, big}) {
    for (float uv : {-big, -1e6f, -25.0f, -1.0f, 0.0f, 1.0f, 25.0f, 1e6f, big}) {
      g.push_back(gv);
      u.push_back(uv);
    }
  }
  std::vector<float> got(g.size()), want(g.size());
  SituGlu(g, u, got);
  SituGluScalar(g, u, want);
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "g " << g[i] << " u " << u[i];
    ASSERT_LE(std::abs(got[i]), kSituBeta1 * kSituBeta2 * (1 + 1e-6f));
    ASSERT_NEAR(got[i], want[i], 2e-5f * std::abs(want[i]) + 1e-6f)
        << "g " << g[i] << " u " << u[i];
  }
  // Both caps saturated: 4 * 1 * 1 * 25.
  std::vector<float> one(1);
  SituGlu(std::vector<float>{1e30f}, std::vector<float>{1e30f}, one);
  EXPECT_NEAR(one[0], 100.0f, 1e-4f);
  SituGlu(std::vector<float>{1e30f}, std::vector<float>{-1e30f}, one);
  EXPECT_NEAR(one[0], -100.0f, 1e-4f);
  // The sigmoid takes the uncapped gate: at g = 8, sigma(8) = 0.99966, not sigma(4 tanh 2).
  SituGlu(std::vector<float>{8.0f}, std::vector<float>{25.0f}, one);
  const double want8 = 4 * std::tanh(2.0) / (1 + std::exp(-8.0)) * 25 * std::tanh(1.0);
  EXPECT_NEAR(one[0], want8, 1e-4);
  // Custom betas.
  SituGlu(std::vector<float>{1e30f}, std::vector<float>{1e30f}, one, 2.0f, 3.0f);
  EXPECT_NEAR(one[0], 6.0f, 1e-5f);
  // In place.
  std::vector<float> gi = {1.0f, -2.0f, 3.0f}, ui = {0.5f, 0.25f, -7.0f}, ref(3);
  SituGluScalar(gi, ui, ref);
  SituGlu(gi, ui, gi);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(gi[i], ref[i], 1e-5f);
}

K3_INSTANTIATE_PER_TARGET(Ops);

}  // namespace
}  // namespace k3::kernels
