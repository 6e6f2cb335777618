#include "kernels/bf16_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/dispatch.h"

namespace k3::kernels {
namespace {

uint16_t F32ToBf16(float f) {  // round to nearest even; the test data has no NaN
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

std::vector<uint16_t> GaussianBf16(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = F32ToBf16(dist(rng));
  return v;
}

std::vector<uint16_t> RandomBits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = static_cast<uint16_t>(rng());
  return v;
}

std::vector<uint8_t> Encode(const std::vector<uint16_t>& values) {
  std::vector<uint8_t> out(Bf16EncodedBound(values.size()));
  out.resize(Bf16Encode(values, out));
  return out;
}

// A second, independent writer of the format as the header comment describes it, with tables
// chosen by the caller (so it can make every value escape, which Bf16Encode never would).
std::vector<uint8_t> ReferenceEncode(const std::vector<uint16_t>& values, const uint8_t* t1,
                                     const uint8_t* t2) {
  const size_t n = values.size(), blocks = (n + 63) / 64;
  std::vector<uint8_t> planes(24 * blocks), sm(n), nibbles, raw;
  size_t n_esc = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t e = static_cast<uint8_t>(values[i] >> 7);
    sm[i] = static_cast<uint8_t>(((values[i] & 0x7F) << 1) | (values[i] >> 15));
    int code = static_cast<int>(std::find(t1, t1 + 7, e) - t1);
    for (int k = 0; k < 3; ++k) {
      if ((code >> k) & 1) planes[24 * (i / 64) + 8 * k + (i % 64) / 8] |= 1 << (i % 8);
    }
    if (code < 7) continue;
    const int nib = static_cast<int>(std::find(t2, t2 + 15, e) - t2);
    if (n_esc % 2 == 0) nibbles.push_back(0);
    nibbles.back() = static_cast<uint8_t>(nibbles.back() | nib << (4 * (n_esc % 2)));
    ++n_esc;
    if (nib == 15) raw.push_back(e);
  }
  std::vector<uint8_t> out(56, 0);
  std::memcpy(out.data(), "K3BC", 4);
  out[4] = 1;
  auto put64 = [&](size_t at, uint64_t v) {
    for (int k = 0; k < 8; ++k) out[at + k] = static_cast<uint8_t>(v >> (8 * k));
  };
  put64(8, n);
  put64(16, n_esc);
  put64(24, raw.size());
  std::memcpy(out.data() + 32, t1, 7);
  std::memcpy(out.data() + 39, t2, 15);
  for (const auto* part : {&planes, &sm, &nibbles, &raw})
    out.insert(out.end(), part->begin(), part->end());
  return out;
}

// Bf16Decode on every decoder path this CPU has (the kernel target forced to one that selects
// it): the paths must agree on the verdict and, when valid, on every value; out gets the values.
bool DecodeOnEveryPath(std::span<const uint8_t> in, std::span<uint16_t> out) {
  struct Restore {
    ~Restore() { ForceKernelTarget(0); }
  } restore;
  std::set<Bf16DecodePath> seen;
  std::optional<bool> verdict;
  std::vector<uint16_t> first;
  for (int64_t target : AvailableKernelTargets()) {
    ForceKernelTarget(target);
    const Bf16DecodePath path = ActiveBf16DecodePath();
    if (!seen.insert(path).second) continue;
    std::vector<uint16_t> got(out.size(), 0xA5A5);
    const bool ok = Bf16Decode(in, got);
    if (!verdict.has_value()) {
      verdict = ok;
      first = got;
    } else if (ok != *verdict || (ok && got != first)) {
      ADD_FAILURE() << "the " << Bf16DecodePathName(path) << " decoder disagrees (verdict " << ok
                    << ")";
    }
  }
  std::copy(first.begin(), first.end(), out.begin());
  return *verdict;
}

// Both decoders must reproduce `values` from `enc` bit for bit.
void ExpectDecodes(const std::vector<uint8_t>& enc, const std::vector<uint16_t>& values) {
  std::vector<uint16_t> scalar(values.size(), 0xDEAD), simd(values.size(), 0xBEEF);
  ASSERT_TRUE(Bf16DecodeScalar(enc, scalar)) << "n=" << values.size();
  ASSERT_TRUE(DecodeOnEveryPath(enc, simd)) << "n=" << values.size();
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(scalar[i], values[i]) << "scalar, value " << i << " of " << values.size();
    ASSERT_EQ(simd[i], values[i]) << "simd, value " << i << " of " << values.size();
  }
}

void ExpectRoundTrip(const std::vector<uint16_t>& values) {
  const std::vector<uint8_t> enc = Encode(values);
  ASSERT_LE(enc.size(), Bf16EncodedBound(values.size()));
  EXPECT_EQ(Encode(values), enc) << "not deterministic";
  ExpectDecodes(enc, values);
}

TEST(Bf16Codec, ReportsDecoderPath) {
  std::printf("Bf16Decode path: %s\n",
              std::string(Bf16DecodePathName(ActiveBf16DecodePath())).c_str());
}

TEST(Bf16Codec, RoundTripsGaussianAtSeveralScales) {
  for (float sigma : {1e-6f, 1e-3f, 0.0118f, 0.02f, 1.0f, 300.0f}) {
    SCOPED_TRACE(sigma);
    ExpectRoundTrip(GaussianBf16(458752, sigma, 1));
  }
}

TEST(Bf16Codec, RoundTripsEverySize) {
  for (size_t n : {0, 1, 2, 7, 63, 64, 65, 127, 128, 129, 1000, 4097, 458752, 458752 + 37}) {
    SCOPED_TRACE(n);
    ExpectRoundTrip(GaussianBf16(n, 0.0118f, static_cast<uint32_t>(n)));
  }
}

TEST(Bf16Codec, UniformRandomBitsAreStoredRaw) {
  for (size_t n : {1, 65, 100000}) {
    const std::vector<uint16_t> v = RandomBits(n, 7);
    const std::vector<uint8_t> enc = Encode(v);
    EXPECT_EQ(enc[4], 0) << "expected stored-raw mode";
    EXPECT_EQ(enc.size(), Bf16EncodedBound(n));
    ExpectDecodes(enc, v);
  }
}

TEST(Bf16Codec, RoundTripsAllZerosAndConstants) {
  for (size_t n : {1, 64, 65, 1000, 458752}) {
    ExpectRoundTrip(std::vector<uint16_t>(n, 0));
    ExpectRoundTrip(std::vector<uint16_t>(n, 0x8000));  // -0
    ExpectRoundTrip(std::vector<uint16_t>(n, 0x3F80));
  }
}

TEST(Bf16Codec, RoundTripsSpecialValues) {
  const uint16_t specials[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x8001,
                               0x007F, 0x807F, 0x0000, 0x8000, 0x0080, 0x7F7F, 0xFF7F};
  std::vector<uint16_t> only;
  for (int r = 0; r < 50; ++r) only.insert(only.end(), std::begin(specials), std::end(specials));
  ExpectRoundTrip(only);
  // Sprinkled into Gaussian data, so they go through the coded mode's escapes.
  std::vector<uint16_t> mixed = GaussianBf16(100003, 0.0118f, 3);
  for (size_t i = 0; i < mixed.size(); i += 97) mixed[i] = specials[(i / 97) % std::size(specials)];
  ExpectRoundTrip(mixed);
  EXPECT_EQ(Encode(mixed)[4], 1);
}

TEST(Bf16Codec, ReferenceWriterMatchesEncoder) {
  const std::vector<uint16_t> v = GaussianBf16(10001, 0.0118f, 5);
  const std::vector<uint8_t> enc = Encode(v);
  ASSERT_EQ(enc[4], 1);
  EXPECT_EQ(ReferenceEncode(v, enc.data() + 32, enc.data() + 39), enc);
}

// Tables that hold none of the data's exponents: every value escapes to tier 2 or tier 3.
TEST(Bf16Codec, DecodesWhenEveryValueEscapes) {
  const uint8_t unused7[7] = {0xF0, 0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6};
  for (size_t n : {1, 63, 64, 65, 1000, 458752 + 5}) {
    SCOPED_TRACE(n);
    std::vector<uint16_t> v = GaussianBf16(n, 0.0118f, 11);
    for (uint16_t& x : v) x = static_cast<uint16_t>((x & 0x807F) | (0x70 + x % 15) << 7);
    uint8_t t2[15];
    for (int k = 0; k < 15; ++k) t2[k] = static_cast<uint8_t>(0x70 + k);
    ExpectDecodes(ReferenceEncode(v, unused7, t2), v);  // all tier 2
    uint8_t unused15[15];
    for (int k = 0; k < 15; ++k) unused15[k] = static_cast<uint8_t>(0xE0 + k);
    ExpectDecodes(ReferenceEncode(v, unused7, unused15), v);  // all tier 3
    uint8_t tiers[7 + 15];  // 22 exponents: tier 1, then tier 2 (the rest of 256 is tier 3)
    for (int k = 0; k < 22; ++k) tiers[k] = static_cast<uint8_t>(0x70 + k);
    const std::vector<uint16_t> bits = RandomBits(n, 13);  // a mix of all three tiers
    ExpectDecodes(ReferenceEncode(bits, tiers, tiers + 7), bits);
  }
}

TEST(Bf16Codec, GaussianRatioIsBelowSeventyPercent) {
  for (float sigma : {0.0118f, 1.0f}) {
    const std::vector<uint16_t> v = GaussianBf16(size_t{1} << 22, sigma, 17);
    const std::vector<uint8_t> enc = Encode(v);
    const double ratio = static_cast<double>(enc.size()) / (2.0 * static_cast<double>(v.size()));
    std::printf("sigma %g: %zu values -> %zu bytes, ratio %.5f\n", static_cast<double>(sigma),
                v.size(), enc.size(), ratio);
    EXPECT_LE(ratio, 0.70);
    ExpectDecodes(enc, v);
  }
}

// Large outputs (>= 16 MiB, 64-byte aligned) take the SIMD decoder's streaming-store path.
TEST(Bf16Codec, RoundTripsLargeAlignedOutput) {
  const size_t n = (size_t{1} << 23) + 100;
  const std::vector<uint16_t> v = GaussianBf16(n, 0.02f, 29);
  const std::vector<uint8_t> enc = Encode(v);
  std::vector<uint16_t> storage(n + 32);
  const size_t skip = (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64 / 2;
  const std::span<uint16_t> out = std::span(storage).subspan(skip, n);
  ASSERT_TRUE(Bf16Decode(enc, out));
  ASSERT_TRUE(std::equal(out.begin(), out.end(), v.begin()));
  std::fill(out.begin(), out.end(), 0);
  ASSERT_TRUE(Bf16DecodeScalar(enc, out));
  ASSERT_TRUE(std::equal(out.begin(), out.end(), v.begin()));
}

// Both decoders must agree on whether damaged input is valid, and on the values when it is.
void ExpectSameVerdict(const std::vector<uint8_t>& enc, size_t n) {
  std::vector<uint16_t> a(n), b(n);
  const bool ok_scalar = Bf16DecodeScalar(enc, a);
  const bool ok_simd = DecodeOnEveryPath(enc, b);
  ASSERT_EQ(ok_scalar, ok_simd);
  if (ok_scalar) {
    ASSERT_EQ(a, b);
  }
}

std::vector<uint16_t> SmallMixed(size_t n) {
  std::vector<uint16_t> v = GaussianBf16(n, 0.0118f, 23);
  for (size_t i = 0; i < n; i += 9) v[i] = static_cast<uint16_t>(0x7F80 + i);  // tier-3 escapes
  return v;
}

TEST(Bf16Codec, RejectsEveryTruncationAndExtension) {
  for (const std::vector<uint16_t>& v : {SmallMixed(300), RandomBits(100, 3)}) {
    const std::vector<uint8_t> enc = Encode(v);
    std::vector<uint16_t> out(v.size());
    for (size_t len = 0; len < enc.size(); ++len) {
      const std::vector<uint8_t> cut(enc.begin(), enc.begin() + static_cast<ptrdiff_t>(len));
      ASSERT_FALSE(Bf16DecodeScalar(cut, out)) << len;
      ASSERT_FALSE(DecodeOnEveryPath(cut, out)) << len;
    }
    std::vector<uint8_t> longer = enc;
    longer.push_back(0);
    EXPECT_FALSE(Bf16DecodeScalar(longer, out));
    EXPECT_FALSE(DecodeOnEveryPath(longer, out));
    std::vector<uint16_t> wrong(v.size() + 1);
    EXPECT_FALSE(DecodeOnEveryPath(enc, wrong));
    EXPECT_FALSE(Bf16DecodeScalar(enc, std::span(wrong).first(v.size() - 1)));
  }
}

TEST(Bf16Codec, RejectsBadHeadersAndCounts) {
  const std::vector<uint16_t> v = SmallMixed(300);
  const std::vector<uint8_t> enc = Encode(v);
  ASSERT_EQ(enc[4], 1);
  std::vector<uint16_t> out(v.size());
  // Fields whose every change must be caught: magic, mode, zero bytes, n, the two counts.
  for (size_t at : {0, 3, 4, 5, 7, 8, 12, 15, 16, 17, 23, 24, 25, 31, 54, 55}) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> bad = enc;
      bad[at] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_FALSE(Bf16DecodeScalar(bad, out)) << at << ":" << bit;
      EXPECT_FALSE(DecodeOnEveryPath(bad, out)) << at << ":" << bit;
    }
  }
  // Turning an escape (code 7) into code 6 keeps the length but breaks the escape count.
  std::vector<uint8_t> bad = enc;
  auto plane_byte = [&](size_t i, int k) { return 56 + 24 * (i / 64) + 8 * k + (i % 64) / 8; };
  size_t i = 0;
  while ((enc[plane_byte(i, 0)] & enc[plane_byte(i, 1)] & enc[plane_byte(i, 2)] & (1 << i % 8)) ==
         0) {
    ++i;
    ASSERT_LT(i, v.size());
  }
  bad[plane_byte(i, 0)] ^= static_cast<uint8_t>(1 << i % 8);
  EXPECT_FALSE(Bf16DecodeScalar(bad, out));
  EXPECT_FALSE(DecodeOnEveryPath(bad, out));
}

TEST(Bf16Codec, SurvivesRandomDamage) {
  std::mt19937 rng(99);
  for (size_t n : {1, 64, 65, 300, 5000}) {
    const std::vector<uint16_t> v = SmallMixed(n);
    const std::vector<uint8_t> enc = Encode(v);
    for (int trial = 0; trial < 3000; ++trial) {
      std::vector<uint8_t> bad = enc;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) {
        // Mostly the header and the small sections, where damage is structural.
        const size_t at = rng() % 2 ? rng() % std::min<size_t>(bad.size(), 64) : rng() % bad.size();
        bad[at] = static_cast<uint8_t>(rng());
      }
      ExpectSameVerdict(bad, n);
    }
  }
}

TEST(Bf16Codec, ForcedTargetsAllDecode) {
  const std::vector<uint16_t> v = SmallMixed(1000);
  const std::vector<uint8_t> enc = Encode(v);
  for (int64_t target : AvailableKernelTargets()) {
    ForceKernelTarget(target);
    std::vector<uint16_t> out(v.size());
    EXPECT_TRUE(Bf16Decode(enc, out)) << KernelTargetName(target);
    EXPECT_EQ(out, v) << KernelTargetName(target);
  }
  ForceKernelTarget(0);
}

}  // namespace
}  // namespace k3::kernels
