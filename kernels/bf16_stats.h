// The distribution of BF16 exponent fields: what an exact compressor of the trunk can hope to
// save. Trained LLM weights are roughly Gaussian with a per-tensor scale, which gives an 8-bit
// exponent field of ~2.6 bits of entropy over a model; uniform values give ~2.0-2.3 per tensor.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

namespace k3 {

using ExponentHistogram = std::array<uint64_t, 256>;

// Counts the exponent field (bits 7-14) of each little-endian BF16 value in `bytes`. Four
// histograms in turn, summed at the end: values of one tensor share a few exponents, and
// incrementing one counter back to back would wait on its own store.
inline void CountBf16Exponents(std::span<const uint8_t> bytes, ExponentHistogram& counts) {
  std::array<std::array<uint32_t, 256>, 4> lanes{};
  const size_t n = bytes.size() / 2;
  size_t i = 0;
  auto exponent = [&](size_t k) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * k, 2);
    return (v >> 7) & 0xff;
  };
  while (i < n) {
    // At most 2^32 - 1 per lane between flushes.
    const size_t end = std::min(n, i + (size_t{1} << 33));
    for (; i + 4 <= end; i += 4) {
      for (size_t l = 0; l < 4; ++l) ++lanes[l][exponent(i + l)];
    }
    for (; i < end; ++i) ++lanes[0][exponent(i)];
    for (auto& lane : lanes) {
      for (size_t e = 0; e < 256; ++e) counts[e] += std::exchange(lane[e], 0);
    }
  }
}

inline uint64_t HistogramTotal(const ExponentHistogram& counts) {
  uint64_t n = 0;
  for (uint64_t c : counts) n += c;
  return n;
}

// Shannon entropy in bits of the distribution the counts describe (0 for no counts).
inline double EntropyBits(const ExponentHistogram& counts) {
  const double n = static_cast<double>(HistogramTotal(counts));
  double h = 0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    h -= p * std::log2(p);
  }
  return h;
}

inline void AddHistogram(const ExponentHistogram& from, ExponentHistogram& to) {
  for (size_t i = 0; i < from.size(); ++i) to[i] += from[i];
}

}  // namespace k3
