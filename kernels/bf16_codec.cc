#include "kernels/bf16_codec.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "kernels/bf16_stats.h"
#include "kernels/dispatch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define K3_BF16_CODEC_X86 1
#define K3_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,popcnt")))
#define K3_AVX2_TARGET __attribute__((target("avx2,bmi,popcnt")))
#else
#define K3_BF16_CODEC_X86 0
#endif

namespace k3::kernels {
namespace {

static_assert(std::endian::native == std::endian::little, "the format is read with memcpy");

constexpr size_t kRawHeaderBytes = 16;
constexpr size_t kCodedHeaderBytes = 56;
constexpr size_t kBlock = 64;
constexpr size_t kPlaneBytes = 24;  // three uint64 bit planes per block
constexpr uint8_t kMagic[4] = {'K', '3', 'B', 'C'};
constexpr uint8_t kModeRaw = 0;
constexpr uint8_t kModeCoded = 1;
constexpr int kTier1 = 7;   // codes 0..6; code 7 escapes
constexpr int kTier2 = 15;  // nibbles 0..14; nibble 15 escapes to a raw byte
#if K3_BF16_CODEC_X86
// Software prefetch distance: helps the input streams coming from DRAM (measured, Zen 5).
constexpr size_t kPrefetchBlocks = 32;
constexpr size_t kStreamBytes = size_t{16} << 20;
#endif

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void StoreU64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// Bit 0 of each of the 8 bytes of x, as an 8-bit number (byte i -> bit i). The multiply places
// byte i's bit at bit 56 + i without carries.
inline uint64_t GatherBits(uint64_t x) {
  return ((x & 0x0101010101010101ull) * 0x0102040810204080ull) >> 56;
}

size_t CodedBytes(size_t n, size_t n_esc, size_t n_raw) {
  return kCodedHeaderBytes + kPlaneBytes * ((n + kBlock - 1) / kBlock) + n + (n_esc + 1) / 2 +
         n_raw;
}

// Where each section of a validated coded buffer starts.
struct Coded {
  size_t n = 0, blocks = 0, n_esc = 0, n_raw = 0;
  const uint8_t* planes = nullptr;
  const uint8_t* sm = nullptr;
  const uint8_t* nibbles = nullptr;
  const uint8_t* raw = nullptr;
  std::array<uint8_t, 8> t1{};  // t1[7] unused (escape)
  std::array<uint8_t, 16> t2{};
};

enum class Mode { kBad, kRaw, kCoded };

// Checks everything that can be checked without decoding: magic, mode, zero fields, n, and that
// the section sizes add up to exactly in.size().
Mode Parse(std::span<const uint8_t> in, size_t n, Coded* c) {
  if (in.size() < kRawHeaderBytes || std::memcmp(in.data(), kMagic, 4) != 0) return Mode::kBad;
  if (in[5] != 0 || in[6] != 0 || in[7] != 0 || LoadU64(in.data() + 8) != n) return Mode::kBad;
  if (in[4] == kModeRaw) {
    const size_t body = in.size() - kRawHeaderBytes;
    return body % 2 == 0 && body / 2 == n ? Mode::kRaw : Mode::kBad;
  }
  if (in[4] != kModeCoded || in.size() < kCodedHeaderBytes || n == 0) return Mode::kBad;
  if (in[54] != 0 || in[55] != 0) return Mode::kBad;
  const uint64_t n_esc = LoadU64(in.data() + 16), n_raw = LoadU64(in.data() + 24);
  // n <= in.size() first, so that the sum below cannot overflow.
  if (n > in.size() || n_esc > n || n_raw > n_esc) return Mode::kBad;
  if (CodedBytes(n, n_esc, n_raw) != in.size()) return Mode::kBad;
  c->n = n;
  c->blocks = (n + kBlock - 1) / kBlock;
  c->n_esc = n_esc;
  c->n_raw = n_raw;
  c->planes = in.data() + kCodedHeaderBytes;
  c->sm = c->planes + kPlaneBytes * c->blocks;
  c->nibbles = c->sm + n;
  c->raw = c->nibbles + (n_esc + 1) / 2;
  std::memcpy(c->t1.data(), in.data() + 32, kTier1);
  std::memcpy(c->t2.data(), in.data() + 39, kTier2);
  return Mode::kCoded;
}

// An odd escape count leaves the last high nibble unused; it must be zero.
bool NibblePaddingOk(const Coded& c) {
  return c.n_esc % 2 == 0 || (c.nibbles[c.n_esc / 2] >> 4) == 0;
}

bool PaddingBitsOk(uint64_t p0, uint64_t p1, uint64_t p2, size_t count) {
  return count == kBlock || ((p0 | p1 | p2) >> count) == 0;
}

// The three 64-bit planes of block b.
struct Planes {
  uint64_t p0, p1, p2;
};
inline Planes LoadPlanes(const Coded& c, size_t b) {
  const uint8_t* pl = c.planes + kPlaneBytes * b;
  return {LoadU64(pl), LoadU64(pl + 8), LoadU64(pl + 16)};
}

// The 3-bit code of value j of a block.
inline uint32_t CodeAt(const Planes& p, size_t j) {
  return static_cast<uint32_t>(((p.p0 >> j) & 1) | (((p.p1 >> j) & 1) << 1) |
                               (((p.p2 >> j) & 1) << 2));
}

inline uint16_t Assemble(uint32_t sm, uint32_t e) {
  return static_cast<uint16_t>(((sm & 1) << 15) | (e << 7) | (sm >> 1));
}

// The escapes' exponents in value order: T2 by nibble, else the next raw byte.
struct EscapeReader {
  const Coded& c;
  size_t esc = 0, raw = 0;

  bool Next(uint32_t* e) {
    if (esc == c.n_esc) return false;
    const uint32_t nib = (c.nibbles[esc >> 1] >> ((esc & 1) * 4)) & 15;
    ++esc;
    if (nib < kTier2) {
      *e = c.t2[nib];
      return true;
    }
    if (raw == c.n_raw) return false;
    *e = c.raw[raw++];
    return true;
  }
  // Every escape and raw byte used, none left over.
  bool Done() const { return esc == c.n_esc && raw == c.n_raw && NibblePaddingOk(c); }
};

// Block b value by value: the scalar decoder, and the AVX2 decoder's last, partial block.
bool DecodeBlockScalar(const Coded& c, size_t b, EscapeReader& escapes, uint16_t* out) {
  const Planes p = LoadPlanes(c, b);
  const size_t base = b * kBlock, count = std::min(kBlock, c.n - base);
  if (!PaddingBitsOk(p.p0, p.p1, p.p2, count)) return false;
  for (size_t j = 0; j < count; ++j) {
    const uint32_t code = CodeAt(p, j);
    uint32_t e = c.t1[code];
    if (code == kTier1 && !escapes.Next(&e)) return false;
    out[base + j] = Assemble(c.sm[base + j], e);
  }
  return true;
}

bool DecodeCodedScalar(const Coded& c, uint16_t* out) {
  EscapeReader escapes{c};
  for (size_t b = 0; b < c.blocks; ++b) {
    if (!DecodeBlockScalar(c, b, escapes, out)) return false;
  }
  return escapes.Done();
}

#if K3_BF16_CODEC_X86

bool CpuHasAvx512Codec() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vbmi") &&
                         __builtin_cpu_supports("avx512vbmi2");
  return ok;
}

// The decoded escape exponents, plus 64 bytes so that a full vector can always be loaded at any
// position <= n_esc. Per thread, grown on demand and reused.
uint8_t* EscapeScratch(size_t n_esc) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < n_esc + kBlock) scratch.resize(n_esc + kBlock);
  return scratch.data();
}

K3_AVX512_TARGET inline __mmask64 LowBits64(size_t count) {
  return _cvtu64_mask64(count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1);
}

// _mm512_permutexvar_epi8 itself trips GCC 12's -Wmaybe-uninitialized (its undefined pass-through
// operand); the zero-masking form with every lane selected is the same instruction.
K3_AVX512_TARGET inline __m512i PermuteBytes(__m512i idx, __m512i table) {
  return _mm512_maskz_permutexvar_epi8(LowBits64(64), idx, table);
}

// Turns the escape nibbles into exponent bytes, 64 at a time. Loads are masked to the bytes
// that exist, and masked-off bytes are never touched (AVX-512 fault suppression).
K3_AVX512_TARGET bool UnpackEscapesAvx512(const Coded& c, uint8_t* esc) {
  const __m512i t2 =
      _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.t2.data())));
  const __m512i low_nibble = _mm512_set1_epi16(0x000F), high_nibble = _mm512_set1_epi16(0x0F00);
  const __m512i fifteen = _mm512_set1_epi8(15);
  size_t raw = 0;
  for (size_t i = 0; i < c.n_esc; i += kBlock) {
    const size_t count = std::min(kBlock, c.n_esc - i);
    const __mmask32 bytes = _cvtu32_mask32(static_cast<uint32_t>(LowBits64((count + 1) / 2)));
    const __m512i z = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(bytes, c.nibbles + i / 2));
    // Byte 2k gets the low nibble of input byte k, byte 2k + 1 its high nibble.
    const __m512i nib = _mm512_or_si512(_mm512_and_si512(z, low_nibble),
                                        _mm512_and_si512(_mm512_slli_epi16(z, 4), high_nibble));
    const __mmask64 k15 = _mm512_mask_cmpeq_epi8_mask(LowBits64(count), nib, fifteen);
    const size_t n15 = static_cast<size_t>(std::popcount(_cvtmask64_u64(k15)));
    if (n15 > c.n_raw - raw) return false;
    const __m512i raw_bytes = _mm512_maskz_loadu_epi8(LowBits64(n15), c.raw + raw);
    raw += n15;
    const __m512i e = _mm512_mask_expand_epi8(PermuteBytes(nib, t2), k15, raw_bytes);
    _mm512_storeu_si512(esc + i, e);
  }
  return raw == c.n_raw && NibblePaddingOk(c);
}

K3_AVX512_TARGET bool DecodeCodedAvx512(const Coded& c, uint16_t* out) {
  uint8_t* esc = EscapeScratch(c.n_esc);
  if (!UnpackEscapesAvx512(c, esc)) return false;

  alignas(64) uint8_t table[64] = {};
  std::memcpy(table, c.t1.data(), kTier1);
  // vpermt2b indices that interleave sm (low byte) with e (high byte, indices 64 + i).
  alignas(64) uint8_t lo_idx[64], hi_idx[64];
  for (uint8_t i = 0; i < 32; ++i) {
    lo_idx[2 * i] = i;
    lo_idx[2 * i + 1] = static_cast<uint8_t>(64 + i);
    hi_idx[2 * i] = static_cast<uint8_t>(32 + i);
    hi_idx[2 * i + 1] = static_cast<uint8_t>(96 + i);
  }
  const __m512i t1 = _mm512_load_si512(table);
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2), four = _mm512_set1_epi8(4);

  // Locals, not c's fields: the stores through `out` could alias them and force reloads.
  const uint8_t* const planes = c.planes;
  const uint8_t* const sms = c.sm;
  const size_t n_esc = c.n_esc, full = c.n / kBlock;
  // Output far larger than the caches is written around them: it would be evicted before use,
  // and streaming stores save the read of each line that a normal store first does.
  const bool stream =
      full * kBlock * 2 >= kStreamBytes && reinterpret_cast<uintptr_t>(out) % 64 == 0;
  size_t pos = 0;
  for (size_t b = 0; b < full; ++b) {
    const uint8_t* pl = planes + kPlaneBytes * b;
    _mm_prefetch(reinterpret_cast<const char*>(pl + kPlaneBytes * kPrefetchBlocks), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(sms + kBlock * (b + kPrefetchBlocks)), _MM_HINT_T0);
    const uint64_t p0 = LoadU64(pl), p1 = LoadU64(pl + 8), p2 = LoadU64(pl + 16);
    __m512i idx = _mm512_maskz_mov_epi8(_cvtu64_mask64(p0), one);
    idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(p1), idx, two);
    idx = _mm512_mask_add_epi8(idx, _cvtu64_mask64(p2), idx, four);
    const uint64_t escapes = p0 & p1 & p2;
    // pos <= n_esc here, so the 64-byte load stays inside the scratch.
    const __m512i e = _mm512_mask_expand_epi8(PermuteBytes(idx, t1), _cvtu64_mask64(escapes),
                                              _mm512_loadu_si512(esc + pos));
    pos += static_cast<size_t>(std::popcount(escapes));
    if (pos > n_esc) return false;
    const __m512i sm = _mm512_loadu_si512(sms + kBlock * b);
    // (e << 8 | sm) rotated right by one bit is the bf16 value.
    const __m512i w0 = _mm512_permutex2var_epi8(sm, lo, e);
    const __m512i w1 = _mm512_permutex2var_epi8(sm, hi, e);
    if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + kBlock * b),
                          _mm512_shrdi_epi16(w0, w0, 1));
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + kBlock * b + 32),
                          _mm512_shrdi_epi16(w1, w1, 1));
    } else {
      _mm512_storeu_si512(out + kBlock * b, _mm512_shrdi_epi16(w0, w0, 1));
      _mm512_storeu_si512(out + kBlock * b + 32, _mm512_shrdi_epi16(w1, w1, 1));
    }
  }
  if (stream) _mm_sfence();
  if (full < c.blocks) {
    const Planes p = LoadPlanes(c, full);
    const size_t base = full * kBlock, count = c.n - base;
    if (!PaddingBitsOk(p.p0, p.p1, p.p2, count)) return false;
    for (size_t j = 0; j < count; ++j) {
      const uint32_t code = CodeAt(p, j);
      uint32_t e = c.t1[code];
      if (code == kTier1) {
        if (pos == c.n_esc) return false;
        e = esc[pos++];
      }
      out[base + j] = Assemble(c.sm[base + j], e);
    }
  }
  return pos == c.n_esc;
}

bool CpuHasAvx2Codec() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi");
  return ok;
}

// The 32 bits of m as 32 bytes, `weight` where the bit is set and 0 where not: broadcast, pick
// byte i / 8 of the word for byte i, test bit i % 8.
K3_AVX2_TARGET inline __m256i SpreadBits(uint32_t m, char weight) {
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                        2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), pick);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(weight));
}

// The 32 codes of one half block, one byte each, from its three plane words.
K3_AVX2_TARGET inline __m256i CodesAvx2(uint32_t m0, uint32_t m1, uint32_t m2) {
  return _mm256_or_si256(_mm256_or_si256(SpreadBits(m0, 1), SpreadBits(m1, 2)), SpreadBits(m2, 4));
}

// AVX2 has no byte expand, so the vector pass writes every value with its tier-1 exponent (an
// escape gets a placeholder) and the escapes, ~2.5 % of trained weights, are then written one
// by one over it. Measured on an AVX2 EPYC: patching the exponent vector before assembling (a
// store, byte stores, a reload that waits on them) decodes at 0.65x of this; streaming stores,
// which the patch stores would then hit, at 0.05x, so the output goes through the caches.
K3_AVX2_TARGET bool DecodeCodedAvx2(const Coded& c, uint16_t* out) {
  alignas(32) uint8_t table[32] = {};
  std::memcpy(table, c.t1.data(), kTier1);
  std::memcpy(table + 16, c.t1.data(), kTier1);  // vpshufb looks up within each 128-bit lane
  const __m256i t1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(table));
  const size_t full = c.n / kBlock;
  EscapeReader escapes{c};
  for (size_t b = 0; b < full; ++b) {
    const Planes p = LoadPlanes(c, b);
    const size_t base = b * kBlock;
    for (size_t h = 0; h < 2; ++h) {
      const int shift = static_cast<int>(32 * h);
      const __m256i e = _mm256_shuffle_epi8(
          t1, CodesAvx2(static_cast<uint32_t>(p.p0 >> shift), static_cast<uint32_t>(p.p1 >> shift),
                        static_cast<uint32_t>(p.p2 >> shift)));
      const __m256i sm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.sm + base + 32 * h));
      // Lane-crossing order first, so that the in-lane unpacks give values 0-15 and 16-31.
      const __m256i sm_q = _mm256_permute4x64_epi64(sm, 0xD8);
      const __m256i e_q = _mm256_permute4x64_epi64(e, 0xD8);
      const __m256i w0 = _mm256_unpacklo_epi8(sm_q, e_q), w1 = _mm256_unpackhi_epi8(sm_q, e_q);
      // (e << 8 | sm) rotated right by one bit is the bf16 value.
      const __m256i v0 = _mm256_or_si256(_mm256_srli_epi16(w0, 1), _mm256_slli_epi16(w0, 15));
      const __m256i v1 = _mm256_or_si256(_mm256_srli_epi16(w1, 1), _mm256_slli_epi16(w1, 15));
      __m256i* dst = reinterpret_cast<__m256i*>(out + base + 32 * h);
      _mm256_storeu_si256(dst, v0);
      _mm256_storeu_si256(dst + 1, v1);
    }
    for (uint64_t m = p.p0 & p.p1 & p.p2; m != 0; m &= m - 1) {
      const size_t j = base + static_cast<size_t>(std::countr_zero(m));
      uint32_t e;
      if (!escapes.Next(&e)) return false;
      out[j] = Assemble(c.sm[j], e);
    }
  }
  if (full < c.blocks && !DecodeBlockScalar(c, full, escapes, out)) return false;
  return escapes.Done();
}

#endif  // K3_BF16_CODEC_X86

bool DecodeImpl(std::span<const uint8_t> in, std::span<uint16_t> out, Bf16DecodePath path) {
  Coded c;
  switch (Parse(in, out.size(), &c)) {
    case Mode::kBad:
      return false;
    case Mode::kRaw:
      if (!out.empty()) std::memcpy(out.data(), in.data() + kRawHeaderBytes, out.size_bytes());
      return true;
    case Mode::kCoded:
      break;
  }
  switch (path) {
#if K3_BF16_CODEC_X86
    case Bf16DecodePath::kAvx512:
      return DecodeCodedAvx512(c, out.data());
    case Bf16DecodePath::kAvx2:
      return DecodeCodedAvx2(c, out.data());
#endif
    default:
      return DecodeCodedScalar(c, out.data());
  }
}

}  // namespace

size_t Bf16EncodedBound(size_t n) { return kRawHeaderBytes + 2 * n; }

size_t Bf16Encode(std::span<const uint16_t> values, std::span<uint8_t> out) {
  const size_t n = values.size();
  if (out.size() < Bf16EncodedBound(n)) throw std::invalid_argument("Bf16Encode: out too small");

  ExponentHistogram count{};
  CountBf16Exponents({reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()}, count);
  // Most frequent first, ties by exponent value: deterministic.
  std::array<uint8_t, 256> order;
  std::iota(order.begin(), order.end(), uint8_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](uint8_t a, uint8_t b) { return count[a] > count[b]; });
  size_t n_esc = n, n_raw;
  for (int k = 0; k < kTier1; ++k) n_esc -= count[order[k]];
  n_raw = n_esc;
  for (int k = kTier1; k < kTier1 + kTier2; ++k) n_raw -= count[order[k]];

  std::memcpy(out.data(), kMagic, 4);
  std::memset(out.data() + 4, 0, 4);
  StoreU64(out.data() + 8, n);
  const size_t coded_bytes = CodedBytes(n, n_esc, n_raw);
  if (n == 0 || coded_bytes >= Bf16EncodedBound(n)) {
    out[4] = kModeRaw;
    if (n > 0) std::memcpy(out.data() + kRawHeaderBytes, values.data(), values.size_bytes());
    return Bf16EncodedBound(n);
  }

  out[4] = kModeCoded;
  StoreU64(out.data() + 16, n_esc);
  StoreU64(out.data() + 24, n_raw);
  std::array<uint8_t, 256> code, nibble;
  code.fill(kTier1);
  nibble.fill(kTier2);
  for (int k = 0; k < kTier1; ++k) {
    out[32 + k] = order[k];
    code[order[k]] = static_cast<uint8_t>(k);
  }
  for (int k = 0; k < kTier2; ++k) {
    out[39 + k] = order[kTier1 + k];
    nibble[order[kTier1 + k]] = static_cast<uint8_t>(k);
  }
  out[54] = out[55] = 0;

  const size_t blocks = (n + kBlock - 1) / kBlock;
  uint8_t* planes = out.data() + kCodedHeaderBytes;
  uint8_t* sm = planes + kPlaneBytes * blocks;
  uint8_t* nibbles = sm + n;
  uint8_t* raw = nibbles + (n_esc + 1) / 2;
  std::memset(nibbles, 0, (n_esc + 1) / 2);
  size_t esc = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t base = b * kBlock, cnt = std::min(kBlock, n - base);
    uint8_t codes[kBlock] = {};
    for (size_t j = 0; j < cnt; ++j) {
      const uint32_t v = values[base + j];
      codes[j] = code[(v >> 7) & 0xFF];
      sm[base + j] = static_cast<uint8_t>(((v & 0x7F) << 1) | (v >> 15));
    }
    // Eight codes at a time into the three planes (GatherBits), rather than bit by bit.
    uint64_t p0 = 0, p1 = 0, p2 = 0;
    for (size_t g = 0; g < 8; ++g) {
      const uint64_t x = LoadU64(codes + 8 * g);
      p0 |= GatherBits(x) << (8 * g);
      p1 |= GatherBits(x >> 1) << (8 * g);
      p2 |= GatherBits(x >> 2) << (8 * g);
    }
    StoreU64(planes + kPlaneBytes * b, p0);
    StoreU64(planes + kPlaneBytes * b + 8, p1);
    StoreU64(planes + kPlaneBytes * b + 16, p2);
    for (uint64_t escapes = p0 & p1 & p2; escapes != 0; escapes &= escapes - 1) {
      const uint32_t e =
          (values[base + static_cast<size_t>(std::countr_zero(escapes))] >> 7) & 0xFF;
      const uint32_t nib = nibble[e];
      nibbles[esc >> 1] = static_cast<uint8_t>(nibbles[esc >> 1] | (nib << ((esc & 1) * 4)));
      ++esc;
      if (nib == kTier2) *raw++ = static_cast<uint8_t>(e);
    }
  }
  return coded_bytes;
}

Bf16DecodePath ActiveBf16DecodePath() {
#if K3_BF16_CODEC_X86
  // The dispatched kernel target, so that forcing a lesser one (tests, benchmarks) applies here
  // too. (hwy::SupportedTargets() would run CPUID on every call.)
  const std::string_view target = ActiveKernelTarget();
  if (target.starts_with("AVX3") && CpuHasAvx512Codec()) return Bf16DecodePath::kAvx512;
  if (target.starts_with("AVX") && CpuHasAvx2Codec()) return Bf16DecodePath::kAvx2;
#endif
  return Bf16DecodePath::kScalar;
}

std::string_view Bf16DecodePathName(Bf16DecodePath path) {
  switch (path) {
    case Bf16DecodePath::kAvx512:
      return "AVX-512 VBMI2";
    case Bf16DecodePath::kAvx2:
      return "AVX2";
    case Bf16DecodePath::kScalar:
      break;
  }
  return "scalar";
}

bool Bf16Decode(std::span<const uint8_t> in, std::span<uint16_t> out) {
  return DecodeImpl(in, out, ActiveBf16DecodePath());
}

bool Bf16DecodeScalar(std::span<const uint8_t> in, std::span<uint16_t> out) {
  return DecodeImpl(in, out, Bf16DecodePath::kScalar);
}

}  // namespace k3::kernels
