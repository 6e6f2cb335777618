#include "kernels/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/kernels/test_util.h"

namespace k3::kernels {
namespace {

using testing::DotErrorBound;
using testing::PerTarget;
using testing::RandomFloats;
using testing::SameBits;

// Random bfloat16 bits: fp32 randoms truncated to their top half.
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<uint16_t> out(n);
  const std::vector<float> f = RandomFloats(n, seed, lo, hi);
  for (size_t i = 0; i < n; ++i)
    out[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(f[i]) >> 16);
  return out;
}

class Bf16 : public PerTarget {};

TEST_P(Bf16, WidensEveryBitPatternExactly) {
  std::vector<uint16_t> all(65536 + 5);  // + 5: a length that is not a multiple of the vector
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(all.size());
  Bf16ToF32(all, out);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), uint32_t{all[i]} << 16) << i;
  }
  EXPECT_EQ(Bf16ToF32(uint16_t{0x3F80}), 1.0f);
}

struct RowsCols {
  size_t rows;
  size_t cols;
};

std::vector<double> AbsProducts(const std::vector<uint16_t>& w, size_t rows, size_t cols,
                                std::span<const float> x) {
  std::vector<double> out(rows);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t k = 0; k < cols; ++k) s += std::abs(double{Bf16ToF32(w[r * cols + k])} * x[k]);
    out[r] = s;
  }
  return out;
}

// Column counts around every vector width (4, 8, 16) and the real 7168.
TEST_P(Bf16, MatVecMatchesScalar) {
  for (const RowsCols s :
       {RowsCols{1, 1}, RowsCols{3, 3}, RowsCols{5, 7}, RowsCols{9, 15}, RowsCols{4, 16},
        RowsCols{7, 17}, RowsCols{6, 33}, RowsCols{11, 100}, RowsCols{13, 7168}}) {
    const std::vector<uint16_t> w = RandomBf16(s.rows * s.cols, 50 + s.cols);
    const std::vector<float> x = RandomFloats(s.cols, 60 + s.cols);
    const Bf16Matrix m{w, s.rows, s.cols};
    std::vector<float> got(s.rows, -1.0f), want(s.rows, -2.0f);
    Bf16MatVec(m, x, got, 0, s.rows);
    Bf16MatVecScalar(m, x, want, 0, s.rows);
    const std::vector<double> abs_sum = AbsProducts(w, s.rows, s.cols, x);
    for (size_t r = 0; r < s.rows; ++r) {
      ASSERT_NEAR(got[r], want[r], DotErrorBound(s.cols, abs_sum[r]))
          << "row " << r << " of " << s.rows << "x" << s.cols;
    }
  }
}

TEST_P(Bf16, MatMulMatchesScalarAndMatVecBitExactly) {
  // From 8 tokens the panel product runs: 1040 columns are three column blocks, the last a
  // short one; 600 and 1031 end in a tail chunk.
  for (const RowsCols s : {RowsCols{1, 1}, RowsCols{6, 7}, RowsCols{9, 33}, RowsCols{13, 600},
                           RowsCols{21, 1031}, RowsCols{10, 1040}}) {
    const std::vector<uint16_t> w = RandomBf16(s.rows * s.cols, 70 + s.cols);
    const Bf16Matrix m{w, s.rows, s.cols};
    for (size_t tokens : {1, 2, 3, 4, 5, 8, 16, 64}) {
      const std::vector<float> x = RandomFloats(tokens * s.cols, 80 + tokens);
      for (const auto& [begin, end] :
           {std::pair<size_t, size_t>{0, s.rows}, {s.rows / 3, s.rows - s.rows / 4}}) {
        std::vector<float> got(tokens * s.rows, 777.0f), want(tokens * s.rows, 777.0f);
        Bf16MatMul(m, x, tokens, got, begin, end);
        Bf16MatMulScalar(m, x, tokens, want, begin, end);
        for (size_t t = 0; t < tokens; ++t) {
          const std::span<const float> xt = std::span(x).subspan(t * s.cols, s.cols);
          const std::vector<double> abs_sum = AbsProducts(w, s.rows, s.cols, xt);
          std::vector<float> single(s.rows, 777.0f);
          Bf16MatVec(m, xt, single, begin, end);
          for (size_t r = 0; r < s.rows; ++r) {
            const float g = got[t * s.rows + r];
            if (r < begin || r >= end) {
              ASSERT_EQ(g, 777.0f);
              continue;
            }
            ASSERT_NEAR(g, want[t * s.rows + r], DotErrorBound(s.cols, abs_sum[r]));
            ASSERT_TRUE(SameBits(g, single[r]))
                << s.rows << "x" << s.cols << " T " << tokens << " t " << t << " r " << r;
          }
        }
      }
    }
  }
}

TEST_P(Bf16, ResultsDoNotDependOnRowSplitOrThreads) {
  const size_t rows = 37, cols = 777;
  const std::vector<uint16_t> w = RandomBf16(rows * cols, 90);
  const Bf16Matrix m{w, rows, cols};
  for (size_t tokens : {5, 13}) {  // the small-batch product, then the panel product
    const std::vector<float> x = RandomFloats(tokens * cols, 91);
    std::vector<float> whole(tokens * rows);
    Bf16MatMul(m, x, tokens, whole, 0, rows);
    for (size_t parts : {2, 3, 7}) {
      std::vector<float> split(tokens * rows);
      std::vector<std::thread> threads;
      for (size_t p = 0; p < parts; ++p) {
        threads.emplace_back(
            [&, p] { Bf16MatMul(m, x, tokens, split, rows * p / parts, rows * (p + 1) / parts); });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < whole.size(); ++i) {
        ASSERT_TRUE(SameBits(split[i], whole[i])) << "T " << tokens << " at " << i;
      }
    }
  }
}

// A batch whose activations pass 1 MiB goes in groups of tokens (with AVX-512, four of 246 and
// one of 116), each through all the rows: with a partial last panel and a tail chunk, every result
// is bit for bit the matrix-vector product's.
TEST_P(Bf16, TokenGroupsOfALargeBatchGiveTheMatVecBits) {
  const size_t rows = 45, cols = 1045, tokens = 1100;
  const std::vector<uint16_t> w = RandomBf16(rows * cols, 95);
  const Bf16Matrix m{w, rows, cols};
  const std::vector<float> x = RandomFloats(tokens * cols, 96);
  std::vector<float> got(tokens * rows, 777.0f);
  Bf16MatMul(m, x, tokens, got, 5, rows);
  for (size_t t = 0; t < tokens; ++t) {
    std::vector<float> single(rows, 777.0f);
    Bf16MatVec(m, std::span(x).subspan(t * cols, cols), single, 5, rows);
    for (size_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(SameBits(got[t * rows + r], single[r])) << "t " << t << " r " << r;
    }
  }
}

K3_INSTANTIATE_PER_TARGET(Bf16);

TEST(Bf16Args, RejectsMismatchedSizes) {
  const std::vector<uint16_t> w(12);
  const Bf16Matrix m{w, 3, 4};
  std::vector<float> x(4), y(3);
  EXPECT_THROW(Bf16MatVec(m, std::span(x).first(3), y, 0, 3), std::invalid_argument);
  EXPECT_THROW(Bf16MatVec(m, x, y, 0, 4), std::invalid_argument);
  EXPECT_THROW(Bf16MatMul(m, x, 2, y, 0, 3), std::invalid_argument);
  const Bf16Matrix bad{w, 4, 4};
  std::vector<float> y4(4);
  EXPECT_THROW(Bf16MatVec(bad, x, y4, 0, 4), std::invalid_argument);
}

}  // namespace
}  // namespace k3::kernels
