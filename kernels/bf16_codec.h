// Exact (lossless) compression of BF16 weight groups, built to be decoded faster than a disk
// delivers it. Sign and mantissa of trained weights are close to random, so only the exponent
// byte is coded (~2.5 bits of entropy); the result is ~0.694 of the raw size for Gaussian data.
//
// Format of one Bf16Encode output (all integers little-endian; n = number of values):
//
//   offset size  field
//   0      4     magic "K3BC"
//   4      1     mode: 0 = stored raw, 1 = coded
//   5      3     zero
//   8      8     n
//   Mode 0: 2n bytes follow, the values as given. Total 16 + 2n bytes.
//   Mode 1, rest of the header (56 bytes in all):
//   16     8     n_esc: number of values whose 3-bit code is 7 (escapes)
//   24     8     n_raw: number of escapes whose nibble is 15
//   32     7     T1: tier-1 exponent table (codes 0..6)
//   39     15    T2: tier-2 exponent table (nibbles 0..14)
//   54     2     zero
//   then, section after section with no padding:
//   planes  24 * ceil(n / 64) bytes: per block of 64 values, three uint64 words P0, P1, P2; bit j
//           of Pk is bit k of the 3-bit code of value 64 * block + j. Bits past n are zero.
//   sm      n bytes: value i's (mantissa << 1) | sign.
//   nibbles ceil(n_esc / 2) bytes: one 4-bit code per escape, in value order, low nibble first;
//           an unused last high nibble is zero.
//   raw     n_raw bytes: the exponent bytes of the nibble-15 escapes, in value order.
//
// Value i is decoded as: e = T1[code] if code < 7, else T2[nibble] if nibble < 15, else the next
// raw byte; bf16 = (sm & 1) << 15 | e << 7 | sm >> 1. (sm keeps the sign in bit 0 so that
// (e << 8 | sm) becomes the bf16 value with a single 16-bit rotate right by one.)
//
// The exact length follows from the header, so any truncation or extension is rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace k3::kernels {

// Bytes Bf16Encode may write for n values (worst case: incompressible data must still fit).
size_t Bf16EncodedBound(size_t n);

// Encodes n little-endian BF16 values; returns the bytes written to out. Throws
// std::invalid_argument if out.size() < Bf16EncodedBound(values.size()). Deterministic.
size_t Bf16Encode(std::span<const uint16_t> values, std::span<uint8_t> out);

// Decodes exactly out.size() values from `in`, the whole of one Bf16Encode output. Returns false
// (out may then hold garbage) when `in` is malformed. Never reads outside `in` or writes outside
// `out`, whatever the bytes. Bf16Decode takes the best path of the CPU and the kernel target
// (ActiveBf16DecodePath); Bf16DecodeScalar is the portable twin with the same results.
bool Bf16Decode(std::span<const uint8_t> in, std::span<uint16_t> out);
bool Bf16DecodeScalar(std::span<const uint8_t> in, std::span<uint16_t> out);

// The decoder's code paths: AVX-512 with VBMI2 (byte permutes and expand), AVX2, portable.
enum class Bf16DecodePath { kScalar, kAvx2, kAvx512 };

// The path Bf16Decode takes now: AVX-512 when the CPU has VBMI2 and the kernel target is an
// AVX3 one, AVX2 when the CPU has it and the target is AVX2 or better, else scalar (so forcing a
// lesser kernel target, as the tests do, forces the decoder down with it).
Bf16DecodePath ActiveBf16DecodePath();
std::string_view Bf16DecodePathName(Bf16DecodePath path);

}  // namespace k3::kernels
