#include "core/text/tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <queue>

namespace k3::tokenizer_internal {
namespace {

// Pieces up to this many bytes use the quadratic loop: with a few dozen parts a linear rescan
// costs no more than heap maintenance (instruction counts on o200k and a mixed corpus were flat
// between 16 and 128), and it allocates nothing.
constexpr size_t kQuadraticMaxBytes = 64;

}  // namespace

RankTable::RankTable() : pair_(size_t{1} << 16, kNoRank) { byte_.fill(kNoRank); }

bool RankTable::Insert(std::string_view bytes, Rank rank) {
  Rank* slot = nullptr;
  if (bytes.size() == 1) slot = &byte_[static_cast<uint8_t>(bytes[0])];
  if (bytes.size() == 2) slot = &pair_[PairIndex(bytes[0], bytes[1])];
  if (slot != nullptr) {
    if (*slot != kNoRank) return false;
    *slot = rank;
    return true;
  }
  return long_.emplace(bytes, rank).second;
}

void BytePairEncodeQuadratic(std::string_view piece, const RankTable& ranks,
                             std::vector<int32_t>* out) {
  const size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    out->push_back(static_cast<int32_t>(ranks.Find(piece)));
    return;
  }
  // parts[i] = start of part i and the rank of the pair (part i, part i+1); the last two
  // entries are sentinels, as in tiktoken's _byte_pair_merge.
  struct Part {
    uint32_t start;
    Rank pair_rank;   // of this part and the next
    Rank token_rank;  // of this part's bytes: known from the merge that made it
  };
  // Short pieces, the vast majority, keep their parts on the stack: no allocation per piece.
  std::array<Part, kQuadraticMaxBytes + 1> stack_parts;
  std::vector<Part> heap_parts;
  Part* parts = stack_parts.data();
  if (n + 1 > stack_parts.size()) {
    heap_parts.resize(n + 1);
    parts = heap_parts.data();
  }
  size_t size = 0;
  for (size_t i = 0; i + 1 < n; ++i) {
    parts[size++] = {static_cast<uint32_t>(i), ranks.Find(piece.substr(i, 2)),
                     ranks.Find(piece.substr(i, 1))};
  }
  parts[size++] = {static_cast<uint32_t>(n - 1), kNoRank, ranks.Find(piece.substr(n - 1, 1))};
  parts[size++] = {static_cast<uint32_t>(n), kNoRank, kNoRank};

  // Rank of the concatenation of parts i and i+1 (i+2 exists).
  const auto pair_rank = [&](size_t i) {
    if (i + 3 > size) return kNoRank;
    return ranks.Find(piece.substr(parts[i].start, parts[i + 2].start - parts[i].start));
  };
  for (;;) {
    Rank min_rank = kNoRank;
    size_t min_i = 0;
    for (size_t i = 0; i + 1 < size; ++i) {
      if (parts[i].pair_rank < min_rank) {
        min_rank = parts[i].pair_rank;
        min_i = i;
      }
    }
    if (min_rank == kNoRank) break;
    // Merge parts min_i and min_i+1; only the pairs touching the new part change.
    std::copy(parts + min_i + 2, parts + size, parts + min_i + 1);
    --size;
    parts[min_i].token_rank = min_rank;
    parts[min_i].pair_rank = pair_rank(min_i);
    if (min_i > 0) parts[min_i - 1].pair_rank = pair_rank(min_i - 1);
  }
  for (size_t i = 0; i + 1 < size; ++i) out->push_back(static_cast<int32_t>(parts[i].token_rank));
}

void BytePairEncodeHeap(std::string_view piece, const RankTable& ranks, std::vector<int32_t>* out) {
  const size_t n = piece.size();
  if (n == 0) return;
  // Parts form a doubly linked list indexed by their start byte; a merge keeps the left part.
  // end[i] is the end of part i and rank[i] the rank of its bytes.
  // A part that was merged into its left neighbour is dead: its end is set to 0.
  std::vector<uint32_t> end(n), prev(n);
  std::vector<Rank> rank(n);
  for (size_t i = 0; i < n; ++i) {
    end[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i - 1);  // wraps for i = 0; never read there
    rank[i] = ranks.Find(piece.substr(i, 1));
  }

  // A candidate merges the part starting at `left` with its right neighbour, which ends at
  // `right_end`. It is stale once either part changed: `left` died, or the neighbour's end
  // moved. Order: lowest rank, then leftmost, which is tiktoken's choice.
  struct Candidate {
    Rank rank;
    uint32_t left;
    uint32_t right_end;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Candidate> initial;
  initial.reserve(n);
  for (uint32_t i = 0; i + 1 < n; ++i) {
    const Rank r = ranks.Find(piece.substr(i, 2));
    if (r != kNoRank) initial.push_back({r, i, i + 2});
  }
  // Built in linear time from all byte pairs.
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap(
      std::greater<Candidate>(), std::move(initial));
  const auto push_pair = [&](uint32_t left) {
    const uint32_t mid = end[left];
    if (mid >= n) return;
    const uint32_t right_end = end[mid];
    const Rank r = ranks.Find(piece.substr(left, right_end - left));
    if (r != kNoRank) heap.push({r, left, right_end});
  };

  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const uint32_t mid = end[c.left];
    if (mid == 0 || mid >= n || end[mid] != c.right_end) continue;
    end[mid] = 0;
    end[c.left] = c.right_end;
    rank[c.left] = c.rank;
    if (c.right_end < n) prev[c.right_end] = c.left;
    push_pair(c.left);
    if (c.left > 0) push_pair(prev[c.left]);
  }
  for (uint32_t i = 0; i < n; i = end[i]) out->push_back(static_cast<int32_t>(rank[i]));
}

void BytePairEncode(std::string_view piece, const RankTable& ranks, std::vector<int32_t>* out) {
  if (piece.size() <= kQuadraticMaxBytes) {
    BytePairEncodeQuadratic(piece, ranks, out);
  } else {
    BytePairEncodeHeap(piece, ranks, out);
  }
}

}  // namespace k3::tokenizer_internal
