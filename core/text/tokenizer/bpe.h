// Byte-level BPE with tiktoken's semantics (MODEL.md 4.2 step 4): ranks are keyed by raw bytes,
// and the adjacent pair whose concatenation has the lowest rank merges first (ties: leftmost).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace k3::tokenizer_internal {

using Rank = uint32_t;
inline constexpr Rank kNoRank = std::numeric_limits<Rank>::max();

// Maps token bytes to ranks. Keys are views: the caller keeps the bytes alive and unmoved for
// the table's lifetime. One- and two-byte keys sit in flat arrays because every merge starts
// with byte pairs and they dominate the lookups.
class RankTable {
 public:
  RankTable();

  // Returns false (and changes nothing) if `bytes` already has a rank. `bytes` must be non-empty.
  bool Insert(std::string_view bytes, Rank rank);
  void Reserve(size_t n) { long_.reserve(n); }

  Rank Find(std::string_view bytes) const {
    if (bytes.size() == 1) return byte_[static_cast<uint8_t>(bytes[0])];
    if (bytes.size() == 2) return pair_[PairIndex(bytes[0], bytes[1])];
    const auto it = long_.find(bytes);
    return it == long_.end() ? kNoRank : it->second;
  }

 private:
  static size_t PairIndex(char a, char b) {
    return (size_t{static_cast<uint8_t>(a)} << 8) | static_cast<uint8_t>(b);
  }

  // Token bytes are short: a few multiply-mix rounds beat a general string hash by far.
  struct BytesHash {
    size_t operator()(std::string_view s) const {
      uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
      const char* p = s.data();
      size_t n = s.size();
      for (; n >= 8; p += 8, n -= 8) h = Mix(h ^ Load(p, 8));
      return Mix(h ^ Load(p, n));
    }
    static uint64_t Load(const char* p, size_t n) {
      uint64_t v = 0;
      std::memcpy(&v, p, n);
      return v;
    }
    static uint64_t Mix(uint64_t x) {
      const unsigned __int128 m = static_cast<unsigned __int128>(x) * 0xD6E8FEB86659FD93ull;
      return static_cast<uint64_t>(m >> 64) ^ static_cast<uint64_t>(m);
    }
  };

  std::array<Rank, 256> byte_;
  std::vector<Rank> pair_;  // 65536 entries
  absl::flat_hash_map<std::string_view, Rank, BytesHash> long_;
};

// Appends the ranks of `piece` to `out` (as token ids: ranks stay below 2^31). Every single byte
// of `piece` must have a rank. Linear-logarithmic in the piece length: long pieces (a 100 KB run
// without spaces) stay fast.
void BytePairEncode(std::string_view piece, const RankTable& ranks, std::vector<int32_t>* out);

// The two strategies behind BytePairEncode, exposed so that tests can prove them identical.
// Quadratic: tiktoken's own loop (rescan for the minimum after every merge); fastest on the
// short pieces that make up almost all text.
void BytePairEncodeQuadratic(std::string_view piece, const RankTable& ranks,
                             std::vector<int32_t>* out);
// Heap of candidate merges over a linked list of parts, with stale entries skipped on pop.
void BytePairEncodeHeap(std::string_view piece, const RankTable& ranks, std::vector<int32_t>* out);

}  // namespace k3::tokenizer_internal
