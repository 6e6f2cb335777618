// Per-target definitions shared by the MXFP4 and BF16 kernels: the vector type and the final
// reduction of the canonical accumulation (see kernels/README.md):
//
//   acc = 0 (one vector); for each chunk c of the row, in order: acc = MulAdd(w_c, x_c, acc);
//   y = SumOfLanes(acc)
//
// Matrix-vector and small-batch kernels both follow it exactly, so an output is the same
// whatever row range, row blocking or batch produced it.

// Highway per-target include guard: this file is included once per SIMD target.
#if defined(K3_KERNELS_INTERNAL_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef K3_KERNELS_INTERNAL_SIMD_INL_H_
#undef K3_KERNELS_INTERNAL_SIMD_INL_H_
#else
#define K3_KERNELS_INTERNAL_SIMD_INL_H_
#endif

#include <cstddef>
#include <utility>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

// At most 16 floats per vector: one MXFP4 half-group (the 16 even or the 16 odd columns of a
// 32-column group) is then a whole number of vectors on every target.
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
inline constexpr size_t kLanes = hn::MaxLanes(DF());
static_assert(16 % kLanes == 0, "a half-group must be whole vectors");

// Register blocking of the products: kBlockRows rows x kBlockTokens tokens of accumulators,
// each weight chunk decoded once for all of them. With AVX-512, 4 x 4 accumulators plus the
// activation and weight vectors of an MXFP4 group fit the 32 registers; narrower vectors need
// more registers per group, so they take 4 x 2.
inline constexpr size_t kBlockRows = 4;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
inline constexpr size_t kBlockTokens = 4;
#else
inline constexpr size_t kBlockTokens = 2;
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// The reduction tree on 16 lanes, spelled out (it is what SumOfLanes does here) so that
// ReduceSixteen can follow it exactly: lanes i + (i + 8), then i + (i + 4), then i + (i + 2),
// then the last two.
HWY_INLINE float ReduceAcc(VF acc) {
  const __m512 v = acc.raw;
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 p = _mm_add_ps(q, _mm_permute_ps(q, 0x4E));
  return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

// out[j] = ReduceAcc(vector j) for the 16 vectors at acc + 16 * j (64-byte aligned), bit for
// bit: each step of the tree runs on several vectors at once, about 3 instructions a sum
// instead of 10.
HWY_INLINE void ReduceSixteen(const float* HWY_RESTRICT acc, float* HWY_RESTRICT out) {
  __m512 halves[8];  // vectors 2k (lanes 0-7) and 2k + 1 (lanes 8-15): i + (i + 8)
  for (int k = 0; k < 8; ++k) {
    const __m512 a = _mm512_load_ps(acc + 32 * k), b = _mm512_load_ps(acc + 32 * k + 16);
    halves[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 quarters[4];  // block j: vector 4m + j, i + (i + 4)
  for (int m = 0; m < 4; ++m) {
    const __m512 a = halves[2 * m], b = halves[2 * m + 1];
    quarters[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
  }
  __m512 pairs[2];  // block j: lanes 0-1 of vector 8n + j, lanes 2-3 of 8n + 4 + j; i + (i + 2)
  for (int n = 0; n < 2; ++n) {
    const __m512 a = quarters[2 * n], b = quarters[2 * n + 1];
    pairs[n] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // Lane 4j + k holds the sum of vector 4k + j; the permute puts vector v in lane v.
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(pairs[0], pairs[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, sums));
}
#else
HWY_INLINE float ReduceAcc(VF acc) { return hn::GetLane(hn::SumOfLanes(DF(), acc)); }
#endif

// Calls body.template operator()<kSize>(i0) for consecutive blocks of [0, n): full blocks of
// kBlock, then one block of the remaining 1..kBlock-1, with a size instantiated for each value.
template <size_t kBlock, class Body, size_t... kIndex>
HWY_INLINE void ForEachBlockImpl(size_t n, const Body& body, std::index_sequence<kIndex...>) {
  size_t i0 = 0;
  for (; i0 + kBlock <= n; i0 += kBlock) body.template operator()<kBlock>(i0);
  const size_t rest = n - i0;
  ((rest == kIndex + 1 ? body.template operator()<kIndex + 1>(i0) : void()), ...);
}

template <size_t kBlock, class Body>
HWY_INLINE void ForEachBlock(size_t n, const Body& body) {
  ForEachBlockImpl<kBlock>(n, body, std::make_index_sequence<kBlock - 1>());
}

// Token blocks of the small-batch products.
template <class Body>
HWY_INLINE void ForEachTokenBlock(size_t tokens, const Body& body) {
  ForEachBlock<kBlockTokens>(tokens, body);
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
