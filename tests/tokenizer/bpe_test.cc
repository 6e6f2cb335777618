#include "core/text/tokenizer/bpe.h"

#include <chrono>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"

namespace k3::tokenizer_internal {
namespace {

// A rank table that owns its keys.
class OwnedTable {
 public:
  OwnedTable() {
    for (int b = 0; b < 256; ++b) Add(std::string(1, static_cast<char>(b)));
  }
  bool Add(std::string bytes) {
    if (table_.Find(bytes) != kNoRank) return false;
    keys_.push_back(std::move(bytes));
    EXPECT_TRUE(table_.Insert(keys_.back(), static_cast<Rank>(keys_.size() - 1)));
    return true;
  }
  const RankTable& table() const { return table_; }
  const std::string& bytes(Rank r) const { return keys_[r]; }

 private:
  std::deque<std::string> keys_;  // stable addresses
  RankTable table_;
};

std::string Concat(const OwnedTable& t, const std::vector<int32_t>& ranks) {
  std::string out;
  for (int32_t r : ranks) out += t.bytes(static_cast<Rank>(r));
  return out;
}

TEST(RankTableTest, FindsKeysOfEveryLength) {
  OwnedTable t;
  EXPECT_TRUE(t.Add("ab"));
  EXPECT_TRUE(t.Add("abc"));
  EXPECT_FALSE(t.Add("ab"));
  EXPECT_EQ(t.table().Find("a"), static_cast<Rank>('a'));
  EXPECT_EQ(t.table().Find("ab"), 256u);
  EXPECT_EQ(t.table().Find("abc"), 257u);
  EXPECT_EQ(t.table().Find("abcd"), kNoRank);
  EXPECT_EQ(t.table().Find("ba"), kNoRank);
}

TEST(BytePairEncodeTest, LowestRankMergesFirstAndTiesGoLeft) {
  OwnedTable t;
  t.Add("aa");   // 256
  t.Add("aaa");  // 257
  std::vector<int32_t> out;
  // "aaa": "aa" at 0 and 1 tie; the leftmost merges, then "aa"+"a" = "aaa".
  BytePairEncode("aaa", t.table(), &out);
  EXPECT_EQ(out, std::vector<int32_t>({257}));
  out.clear();
  // "aaaaa": a a a a a -> aa a a a -> aa aa a (the pair at 1, rank 256, beats "aaa" at 0)
  // -> aa aaa ("aaaa" is no token).
  BytePairEncode("aaaaa", t.table(), &out);
  EXPECT_EQ(out, std::vector<int32_t>({256, 257}));
  std::vector<int32_t> heap;
  BytePairEncodeHeap("aaaaa", t.table(), &heap);
  EXPECT_EQ(out, heap);
}

TEST(BytePairEncodeTest, HeapAndQuadraticAgreeOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int vocab = 0; vocab < 20; ++vocab) {
    OwnedTable t;
    // Merges of existing tokens over a tiny alphabet: many ties and overlapping candidates.
    std::vector<std::string> tokens = {"a", "b", "c", " "};
    for (int i = 0; i < 200; ++i) {
      const std::string m = tokens[rng() % tokens.size()] + tokens[rng() % tokens.size()];
      if (m.size() <= 12 && t.Add(m)) tokens.push_back(m);
    }
    for (int trial = 0; trial < 300; ++trial) {
      std::string piece;
      const size_t len = 1 + rng() % (trial < 250 ? 40 : 600);
      for (size_t i = 0; i < len; ++i) piece.push_back("abc "[rng() % 4]);
      std::vector<int32_t> quadratic, heap, dispatch;
      BytePairEncodeQuadratic(piece, t.table(), &quadratic);
      BytePairEncodeHeap(piece, t.table(), &heap);
      BytePairEncode(piece, t.table(), &dispatch);
      ASSERT_EQ(quadratic, heap) << piece;
      ASSERT_EQ(quadratic, dispatch) << piece;
      ASSERT_EQ(Concat(t, heap), piece);
    }
  }
}

double SecondsToEncode(const std::string& piece, const RankTable& table,
                       std::vector<int32_t>* out) {
  const auto start = std::chrono::steady_clock::now();
  BytePairEncode(piece, table, out);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(BytePairEncodeTest, LongPiecesStayFast) {
  OwnedTable t;
  std::string run = "a";
  for (int i = 0; i < 12; ++i) {  // "aa", "aaaa", ... 4096 a's
    run += run;
    t.Add(run);
  }
  for (const std::string m : {"ab", "abc", "bc", "cab", "abcab", "xy", "xyz"}) t.Add(m);

  // About 0.05 s each in an optimised build; merging 100,000 bytes pair by pair over and over
  // (the quadratic way) is some 5e9 pair steps, several seconds at the least. The bound is far
  // above the first, so that a loaded two-core machine passes (0.52 s at a load average of
  // 8.5), and below the second.
  constexpr double kBoundSeconds = 3.0;
  std::vector<int32_t> out;
  const std::string same(100'000, 'a');
  EXPECT_LT(SecondsToEncode(same, t.table(), &out),
            kBoundSeconds * tokenizer_testing::SlowBuildFactor());
  EXPECT_EQ(Concat(t, out), same);

  out.clear();
  std::mt19937 rng(1);
  std::string mixed;
  for (int i = 0; i < 100'000; ++i) mixed.push_back("abcxyz"[rng() % 6]);
  EXPECT_LT(SecondsToEncode(mixed, t.table(), &out),
            kBoundSeconds * tokenizer_testing::SlowBuildFactor());
  EXPECT_EQ(Concat(t, out), mixed);
}

}  // namespace
}  // namespace k3::tokenizer_internal
