#include "kernels/mxfp4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/kernels/test_util.h"

namespace k3::kernels {
namespace {

using testing::DotErrorBound;
using testing::PerTarget;
using testing::RandomBytes;
using testing::RandomFloats;
using testing::SameBits;

// ---------------------------------------------------------------------------------------------
// The released-checkpoint fixture.

struct ReleasedFixture {
  size_t rows = 0;
  size_t cols = 0;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scales;
  std::vector<float> expected;
  std::vector<float> swapped_first64;
};

const ReleasedFixture& Released() {
  static const ReleasedFixture* fixture = [] {
    const char* dir = std::getenv("K3_SHARED_DIR");
    if (dir == nullptr) throw std::runtime_error("K3_SHARED_DIR is not set (run through ctest)");
    const std::string path = std::string(dir) + "/fixtures/released-mxfp4.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    const nlohmann::json j = nlohmann::json::parse(in);
    auto* f = new ReleasedFixture;
    f->rows = j.at("rows").get<size_t>();
    f->cols = j.at("logical_width").get<size_t>();
    f->packed = j.at("packed").at("data").get<std::vector<uint8_t>>();
    f->scales = j.at("scales").at("data").get<std::vector<uint8_t>>();
    // Every expected value is exactly representable in fp32, so double -> float is exact.
    for (double v : j.at("expected").at("data").get<std::vector<double>>()) {
      f->expected.push_back(static_cast<float>(v));
    }
    for (double v : j.at("expected_swapped_nibbles").at("first64").get<std::vector<double>>()) {
      f->swapped_first64.push_back(static_cast<float>(v));
    }
    return f;
  }();
  return *fixture;
}

using DecodeFn = void (*)(std::span<const uint8_t>, std::span<const uint8_t>, std::span<float>);

std::vector<float> DecodeReleased(DecodeFn decode) {
  const ReleasedFixture& f = Released();
  std::vector<float> out(f.rows * f.cols);
  const size_t packed_cols = f.cols / 2;
  const size_t scale_cols = f.cols / kMxfp4GroupSize;
  for (size_t r = 0; r < f.rows; ++r) {
    decode(std::span(f.packed).subspan(r * packed_cols, packed_cols),
           std::span(f.scales).subspan(r * scale_cols, scale_cols),
           std::span(out).subspan(r * f.cols, f.cols));
  }
  return out;
}

void ExpectMatchesReleased(const std::vector<float>& decoded) {
  const ReleasedFixture& f = Released();
  ASSERT_EQ(f.packed.size(), f.rows * f.cols / 2);
  ASSERT_EQ(f.scales.size(), f.rows * f.cols / kMxfp4GroupSize);
  ASSERT_EQ(decoded.size(), f.expected.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < decoded.size(); ++i) {
    if (!SameBits(decoded[i], f.expected[i]) && mismatches++ < 5) {
      ADD_FAILURE() << "element " << i << " (row " << i / f.cols << ", col " << i % f.cols
                    << "): decoded " << decoded[i] << ", expected " << f.expected[i];
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // The trap: a nibble-swapped decoder has the same statistics but moves every weight.
  ASSERT_EQ(f.swapped_first64.size(), 64u);
  size_t differ = 0;
  for (size_t i = 0; i < 64; ++i) differ += !SameBits(decoded[i], f.swapped_first64[i]);
  EXPECT_GT(differ, 32u) << "the decoder looks nibble-swapped";
}

TEST(Mxfp4Released, ScalarDecoderIsBitExact) {
  ExpectMatchesReleased(DecodeReleased(&DecodeMxfp4RowScalar));
}

class Mxfp4 : public PerTarget {};

TEST_P(Mxfp4, DecoderIsBitExactOnReleasedBytes) {
  ExpectMatchesReleased(DecodeReleased(&DecodeMxfp4Row));
}

TEST(Mxfp4Values, E2M1AndE8M0) {
  const float expected[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_TRUE(SameBits(E2M1Value(c), expected[c])) << c;
  EXPECT_EQ(E8M0Value(127), 1.0f);
  EXPECT_EQ(E8M0Value(0), std::ldexp(1.0f, -127));  // subnormal, not zero
  EXPECT_GT(E8M0Value(0), 0.0f);
  EXPECT_EQ(E8M0Value(0xFE), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8M0Value(0xFF)));
}

// Every code with every scale, against the definition, on the SIMD decoder.
TEST_P(Mxfp4, DecoderCoversAllCodesAndScales) {
  const size_t cols = 256 * 32;  // one group per scale value
  std::vector<uint8_t> packed(cols / 2);
  std::vector<uint8_t> scales(cols / 32);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(i * 37 + i / 16);
  for (size_t g = 0; g < scales.size(); ++g) scales[g] = static_cast<uint8_t>(g);
  std::vector<float> simd(cols), scalar(cols);
  DecodeMxfp4Row(packed, scales, simd);
  DecodeMxfp4RowScalar(packed, scales, scalar);
  for (size_t k = 0; k < cols; ++k) {
    const uint8_t byte = packed[k / 2];
    const uint8_t code = k % 2 == 0 ? byte & 0x0F : byte >> 4;
    const uint8_t s = scales[k / 32];
    if (s == 0xFF) {
      ASSERT_TRUE(std::isnan(simd[k])) << k;
      ASSERT_TRUE(std::isnan(scalar[k])) << k;
      continue;
    }
    const double exact = std::ldexp(static_cast<double>(E2M1Value(code)), s - 127);
    const float want = static_cast<float>(exact);  // rounds once (inf beyond fp32 range)
    ASSERT_TRUE(SameBits(scalar[k], want)) << "k " << k << " code " << int(code) << " s " << int(s);
    ASSERT_TRUE(SameBits(simd[k], want)) << "k " << k << " code " << int(code) << " s " << int(s);
  }
}

// ---------------------------------------------------------------------------------------------
// The 0xFF scan.

TEST_P(Mxfp4, FindsPlantedInvalidScale) {
  for (size_t n : {1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4096, 344064}) {
    std::vector<uint8_t> scales = RandomBytes(n, 7 + n, 0, 0xFE);
    EXPECT_EQ(FindInvalidMxfp4Scale(scales), std::nullopt) << n;
    EXPECT_EQ(FindInvalidMxfp4ScaleScalar(scales), std::nullopt) << n;
    for (size_t pos : {size_t{0}, n / 2, n - 1}) {
      std::vector<uint8_t> planted = scales;
      planted[pos] = 0xFF;
      EXPECT_EQ(FindInvalidMxfp4Scale(planted), pos) << "n " << n << " pos " << pos;
      EXPECT_EQ(FindInvalidMxfp4ScaleScalar(planted), pos) << "n " << n << " pos " << pos;
      if (pos + 1 < n) {  // a later second 0xFF does not hide the first
        planted[n - 1] = 0xFF;
        EXPECT_EQ(FindInvalidMxfp4Scale(planted), pos) << "n " << n << " pos " << pos;
      }
    }
  }
  EXPECT_EQ(FindInvalidMxfp4Scale({}), std::nullopt);
}

// ---------------------------------------------------------------------------------------------
// Products.

struct RandomMatrix {
  size_t rows;
  size_t cols;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scales;
  Mxfp4Matrix view() const { return {packed, scales, rows, cols}; }
};

// Scales drawn from [scale_lo, scale_hi]; the released checkpoint uses 0x70..0x7A.
RandomMatrix MakeMatrix(size_t rows, size_t cols, uint32_t seed, int scale_lo = 0x70,
                        int scale_hi = 0x7A) {
  return {rows, cols, RandomBytes(rows * cols / 2, seed),
          RandomBytes(rows * cols / 32, seed + 1, scale_lo, scale_hi)};
}

// sum_k |W[r, k] x[k]| per row, for the error bound.
std::vector<double> AbsProducts(const RandomMatrix& m, std::span<const float> x) {
  std::vector<double> out(m.rows);
  std::vector<float> row(m.cols);
  for (size_t r = 0; r < m.rows; ++r) {
    DecodeMxfp4RowScalar(std::span(m.packed).subspan(r * m.cols / 2, m.cols / 2),
                         std::span(m.scales).subspan(r * m.cols / 32, m.cols / 32), row);
    double s = 0;
    for (size_t k = 0; k < m.cols; ++k) s += std::abs(static_cast<double>(row[k]) * x[k]);
    out[r] = s;
  }
  return out;
}

void ExpectClose(const RandomMatrix& m, std::span<const float> x, std::span<const float> got,
                 std::span<const float> want, size_t row_begin, size_t row_end) {
  const std::vector<double> abs_sum = AbsProducts(m, x);
  for (size_t r = row_begin; r < row_end; ++r) {
    ASSERT_NEAR(got[r], want[r], DotErrorBound(m.cols, abs_sum[r]))
        << "row " << r << " of " << m.rows << "x" << m.cols;
  }
}

struct Shape {
  size_t rows;
  size_t cols;
};

TEST_P(Mxfp4, MatVecMatchesScalar) {
  for (const Shape s : {Shape{1, 32}, Shape{3, 64}, Shape{5, 96}, Shape{9, 160}, Shape{17, 512},
                        Shape{64, 3584}, Shape{33, 3072}}) {
    const RandomMatrix m = MakeMatrix(s.rows, s.cols, 100 + s.rows);
    const std::vector<float> x = RandomFloats(s.cols, 200 + s.cols);
    std::vector<float> got(s.rows, -1.0f), want(s.rows, -2.0f);
    Mxfp4MatVec(m.view(), x, got, 0, s.rows);
    Mxfp4MatVecScalar(m.view(), x, want, 0, s.rows);
    ExpectClose(m, x, got, want, 0, s.rows);
  }
}

TEST_P(Mxfp4, MatVecWritesOnlyItsRowRange) {
  const RandomMatrix m = MakeMatrix(23, 128, 5);
  const std::vector<float> x = RandomFloats(128, 6);
  for (const auto& [begin, end] :
       {std::pair<size_t, size_t>{0, 23}, {1, 22}, {3, 4}, {5, 5}, {0, 1}, {22, 23}, {2, 19}}) {
    std::vector<float> got(23, 12345.0f), want(23, 12345.0f);
    Mxfp4MatVec(m.view(), x, got, begin, end);
    Mxfp4MatVecScalar(m.view(), x, want, begin, end);
    for (size_t r = 0; r < 23; ++r) {
      if (r < begin || r >= end) {
        EXPECT_EQ(got[r], 12345.0f) << r;
      }
    }
    ExpectClose(m, x, got, want, begin, end);
  }
}

// Scale 0x00 (2^-127, subnormal weights) and 0xFE (2^127) with inputs that keep the products
// finite: the kernels must not flush, saturate or mis-scale at the ends of the E8M0 range.
TEST_P(Mxfp4, ExtremeScales) {
  const size_t rows = 7, cols = 288;
  {
    RandomMatrix m = MakeMatrix(rows, cols, 11, 0x00, 0x00);
    const std::vector<float> x = RandomFloats(cols, 12, -1e30f, 1e30f);
    std::vector<float> got(rows), want(rows);
    Mxfp4MatVec(m.view(), x, got, 0, rows);
    Mxfp4MatVecScalar(m.view(), x, want, 0, rows);
    ExpectClose(m, x, got, want, 0, rows);
  }
  {
    // Codes 0, 1, 8, 9 only (|w| <= 0.5 * 2^127, finite) and tiny activations.
    RandomMatrix m = MakeMatrix(rows, cols, 13, 0xFE, 0xFE);
    for (uint8_t& b : m.packed) b &= 0x99;
    const std::vector<float> x = RandomFloats(cols, 14, -1e-30f, 1e-30f);
    std::vector<float> got(rows), want(rows);
    Mxfp4MatVec(m.view(), x, got, 0, rows);
    Mxfp4MatVecScalar(m.view(), x, want, 0, rows);
    ExpectClose(m, x, got, want, 0, rows);
    for (float v : got) EXPECT_TRUE(std::isfinite(v));
  }
  {
    // Mixed scales 0x00 / 0xFE / typical in one row, x scaled so nothing overflows.
    RandomMatrix m = MakeMatrix(rows, cols, 15);
    for (size_t i = 0; i < m.scales.size(); ++i) m.scales[i] = i % 3 == 0 ? 0x00 : 0x7A;
    const std::vector<float> x = RandomFloats(cols, 16);
    std::vector<float> got(rows), want(rows);
    Mxfp4MatVec(m.view(), x, got, 0, rows);
    Mxfp4MatVecScalar(m.view(), x, want, 0, rows);
    ExpectClose(m, x, got, want, 0, rows);
  }
  {
    // 0xFE with every code: +-inf weights of both signs make every row NaN, in both kernels.
    const RandomMatrix m = MakeMatrix(rows, cols, 17, 0xFE, 0xFE);
    const std::vector<float> x = RandomFloats(cols, 18, 0.5f, 1.0f);
    std::vector<float> got(rows), want(rows);
    Mxfp4MatVec(m.view(), x, got, 0, rows);
    Mxfp4MatVecScalar(m.view(), x, want, 0, rows);
    for (size_t r = 0; r < rows; ++r) {
      EXPECT_TRUE(std::isnan(got[r])) << r;
      EXPECT_TRUE(std::isnan(want[r])) << r;
    }
  }
}

// A 0xFF scale that slipped through makes the affected rows NaN, never a silent zero.
TEST_P(Mxfp4, InvalidScalePropagatesAsNaN) {
  RandomMatrix m = MakeMatrix(6, 64, 21);
  m.scales[2 * 2 + 1] = 0xFF;  // row 2, second group
  const std::vector<float> x = RandomFloats(64, 22);
  std::vector<float> y(6), yt(3 * 6);
  Mxfp4MatVec(m.view(), x, y, 0, 6);
  std::vector<float> x3 = RandomFloats(3 * 64, 23);
  Mxfp4MatMul(m.view(), x3, 3, yt, 0, 6);
  for (size_t r = 0; r < 6; ++r) {
    EXPECT_EQ(std::isnan(y[r]), r == 2) << r;
    for (size_t t = 0; t < 3; ++t) EXPECT_EQ(std::isnan(yt[t * 6 + r]), r == 2) << r;
  }
}

TEST_P(Mxfp4, MatMulMatchesScalarAndMatVecBitExactly) {
  for (const Shape s : {Shape{1, 32}, Shape{6, 96}, Shape{13, 544}, Shape{40, 3584}}) {
    const RandomMatrix m = MakeMatrix(s.rows, s.cols, 300 + s.cols);
    for (size_t tokens : {1, 2, 3, 5, 16, 64}) {
      const std::vector<float> x = RandomFloats(tokens * s.cols, 400 + tokens);
      for (const auto& [begin, end] :
           {std::pair<size_t, size_t>{0, s.rows}, {s.rows / 3, s.rows - s.rows / 4}}) {
        std::vector<float> got(tokens * s.rows, 777.0f), want(tokens * s.rows, 777.0f);
        Mxfp4MatMul(m.view(), x, tokens, got, begin, end);
        Mxfp4MatMulScalar(m.view(), x, tokens, want, begin, end);
        for (size_t t = 0; t < tokens; ++t) {
          const std::span<const float> xt = std::span(x).subspan(t * s.cols, s.cols);
          ExpectClose(m, xt, std::span(got).subspan(t * s.rows, s.rows),
                      std::span(want).subspan(t * s.rows, s.rows), begin, end);
          std::vector<float> single(s.rows, 777.0f);
          Mxfp4MatVec(m.view(), xt, single, begin, end);
          for (size_t r = 0; r < s.rows; ++r) {
            ASSERT_TRUE(SameBits(got[t * s.rows + r], single[r]))
                << "T " << tokens << " t " << t << " r " << r << " range [" << begin << ", " << end
                << "): " << got[t * s.rows + r] << " vs matvec " << single[r];
          }
        }
      }
    }
  }
}

// A batch whose activations pass 1 MiB goes in groups of tokens (480, 480 and 140), each
// through all the rows: with a partial last panel and a partial last column block, every result
// is bit for bit the matrix-vector product's.
TEST_P(Mxfp4, TokenGroupsOfALargeBatchGiveTheMatVecBits) {
  const size_t rows = 45, cols = 544, tokens = 1100;
  const RandomMatrix m = MakeMatrix(rows, cols, 41);
  const std::vector<float> x = RandomFloats(tokens * cols, 42);
  for (const auto& [begin, end] : {std::pair<size_t, size_t>{0, rows}, {5, 38}}) {
    std::vector<float> got(tokens * rows, 777.0f);
    Mxfp4MatMul(m.view(), x, tokens, got, begin, end);
    for (size_t t = 0; t < tokens; ++t) {
      std::vector<float> single(rows, 777.0f);
      Mxfp4MatVec(m.view(), std::span(x).subspan(t * cols, cols), single, begin, end);
      for (size_t r = 0; r < rows; ++r) {
        ASSERT_TRUE(SameBits(got[t * rows + r], single[r]))
            << "t " << t << " r " << r << " range [" << begin << ", " << end
            << "): " << got[t * rows + r] << " vs matvec " << single[r];
      }
    }
  }
}

// Splitting the rows into ranges (as threads would) or running on two threads at once gives
// the same bits as one call over all rows, and repeated calls agree.
TEST_P(Mxfp4, ResultsDoNotDependOnRowSplitOrThreads) {
  const size_t rows = 61, cols = 1024, tokens = 7;
  const RandomMatrix m = MakeMatrix(rows, cols, 31);
  const std::vector<float> x = RandomFloats(tokens * cols, 32);
  std::vector<float> whole(tokens * rows);
  Mxfp4MatMul(m.view(), x, tokens, whole, 0, rows);
  std::vector<float> again(tokens * rows);
  Mxfp4MatMul(m.view(), x, tokens, again, 0, rows);
  EXPECT_EQ(whole, again);
  for (size_t parts : {2, 3, 5, 8}) {
    std::vector<float> split(tokens * rows);
    std::vector<std::thread> threads;
    for (size_t p = 0; p < parts; ++p) {
      threads.emplace_back([&, p] {
        Mxfp4MatMul(m.view(), x, tokens, split, rows * p / parts, rows * (p + 1) / parts);
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < whole.size(); ++i) ASSERT_TRUE(SameBits(split[i], whole[i])) << i;
  }
  std::vector<float> mv_whole(rows), mv_split(rows);
  Mxfp4MatVec(m.view(), std::span(x).first(cols), mv_whole, 0, rows);
  std::thread a([&] { Mxfp4MatVec(m.view(), std::span(x).first(cols), mv_split, 0, 29); });
  std::thread b([&] { Mxfp4MatVec(m.view(), std::span(x).first(cols), mv_split, 29, rows); });
  a.join();
  b.join();
  for (size_t r = 0; r < rows; ++r) ASSERT_TRUE(SameBits(mv_split[r], mv_whole[r])) << r;
}

// One layout of the activations, shared by row ranges on several threads (as the engine's row
// tasks share it) and reused for a second matrix, gives the bits of the plain product: for
// small batches and panel batches, and for column counts that end inside a 512-column block.
TEST_P(Mxfp4, LaidOutActivationsGiveThePlainProductsBits) {
  for (const Shape s : {Shape{13, 96}, Shape{29, 544}, Shape{40, 3584}}) {
    const RandomMatrix m = MakeMatrix(s.rows, s.cols, 500 + s.cols);
    const RandomMatrix other = MakeMatrix(s.rows + 3, s.cols, 600 + s.cols);
    for (size_t tokens : {1, 5, 8, 13, 40}) {
      const std::vector<float> x = RandomFloats(tokens * s.cols, 700 + tokens);
      Mxfp4Activations batch;
      batch.Assign(x, tokens, s.cols);
      for (const RandomMatrix* w : {&m, &other}) {
        std::vector<float> want(tokens * w->rows), got(tokens * w->rows, 777.0f);
        Mxfp4MatMul(w->view(), x, tokens, want, 0, w->rows);
        std::vector<std::thread> threads;
        const size_t parts = 3;
        for (size_t p = 0; p < parts; ++p) {
          threads.emplace_back([&, p] {
            Mxfp4MatMul(w->view(), batch, got, w->rows * p / parts, w->rows * (p + 1) / parts);
          });
        }
        for (std::thread& t : threads) t.join();
        for (size_t i = 0; i < want.size(); ++i) {
          ASSERT_TRUE(SameBits(got[i], want[i]))
              << s.rows << "x" << s.cols << " T " << tokens << " at " << i;
        }
      }
    }
  }
}

K3_INSTANTIATE_PER_TARGET(Mxfp4);

TEST(Mxfp4Args, RejectsMismatchedSizes) {
  const RandomMatrix m = MakeMatrix(4, 64, 1);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(Mxfp4MatVec(m.view(), std::span(x).first(63), y, 0, 4), std::invalid_argument);
  EXPECT_THROW(Mxfp4MatVec(m.view(), x, y, 0, 5), std::invalid_argument);
  EXPECT_THROW(Mxfp4MatVec(m.view(), x, y, 3, 2), std::invalid_argument);
  Mxfp4Matrix bad = m.view();
  bad.cols = 48;
  EXPECT_THROW(Mxfp4MatVec(bad, std::span(x).first(48), y, 0, 4), std::invalid_argument);
  EXPECT_THROW(Mxfp4MatMul(m.view(), x, 2, y, 0, 4), std::invalid_argument);
  Mxfp4Activations batch;
  EXPECT_THROW(batch.Assign(std::span(x).first(48), 1, 48), std::invalid_argument);
  EXPECT_THROW(batch.Assign(x, 2, 64), std::invalid_argument);
  std::vector<float> x96(96);
  batch.Assign(x96, 1, 96);  // a matrix of 64 columns cannot take 96-column activations
  EXPECT_THROW(Mxfp4MatMul(m.view(), batch, y, 0, 4), std::invalid_argument);
  batch.Assign(x, 1, 64);
  EXPECT_THROW(Mxfp4MatMul(m.view(), batch, std::span(y).first(3), 0, 4), std::invalid_argument);
  std::vector<float> out(64);
  EXPECT_THROW(DecodeMxfp4Row(std::span(m.packed).first(31), std::span(m.scales).first(2), out),
               std::invalid_argument);
}

}  // namespace
}  // namespace k3::kernels
