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

HWY_INLINE float ReduceAcc(VF acc) { return hn::GetLane(hn::SumOfLanes(DF(), acc)); }

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
