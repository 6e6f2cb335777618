#include "core/text/tokenizer/unicode.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"

namespace k3::tokenizer_internal {
namespace {

std::string Repair(std::string_view s) {
  std::string out;
  return RepairUtf8(s, &out) ? out : std::string(s);
}

TEST(RepairUtf8Test, ValidInputIsUntouched) {
  std::string out = "sentinel";
  EXPECT_FALSE(RepairUtf8("héllo 中文 😀 \x7f", &out));
  EXPECT_EQ(out, "sentinel");
  EXPECT_FALSE(RepairUtf8("", &out));
}

TEST(RepairUtf8Test, OneReplacementPerMaximalSubpart) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Repair("a\xFF"
                   "b"),
            "a" + fffd + "b");
  EXPECT_EQ(Repair("\xC3"), fffd);      // truncated at the end
  EXPECT_EQ(Repair("\xE2\x82"), fffd);  // one subpart of two bytes
  EXPECT_EQ(Repair("\xE2\x82"
                   "a"),
            fffd + "a");
  EXPECT_EQ(Repair("\xF0\x9F\x98"), fffd);                           // truncated emoji
  EXPECT_EQ(Repair("\xC0\xAF"), fffd + fffd);                        // overlong: every byte alone
  EXPECT_EQ(Repair("\xE0\x80\x80"), fffd + fffd + fffd);             // overlong 3-byte
  EXPECT_EQ(Repair("\xED\xA0\x80"), fffd + fffd + fffd);             // surrogate
  EXPECT_EQ(Repair("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
  EXPECT_EQ(Repair("\x80\x80"), fffd + fffd);                        // stray continuations
  EXPECT_EQ(Repair("\xF5"), fffd);
  EXPECT_EQ(Repair("\xE4\xB8\xAD\xE4\xB8"), "\xE4\xB8\xAD" + fffd);
}

TEST(IsPythonSpaceTest, MatchesStrIsspace) {
  // The code points for which Python 3's str.isspace() is true.
  const std::vector<char32_t> spaces = {
      0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x1C,   0x1D,   0x1E,   0x1F,   0x20,
      0x85,   0xA0,   0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006,
      0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000};
  size_t count = 0;
  for (char32_t c = 0; c < 0x110000; ++c) count += IsPythonSpace(c);
  EXPECT_EQ(count, spaces.size());
  for (char32_t c : spaces) EXPECT_TRUE(IsPythonSpace(c)) << std::hex << uint32_t{c};
  EXPECT_FALSE(IsPythonSpace(0x180E));
  EXPECT_FALSE(IsPythonSpace(0x200B));
}

// Python's _split_whitespaces_or_nonwhitespaces and slicing, on code points, transcribed.
std::vector<std::u32string> ReferenceChunks(const std::u32string& text, size_t max_slice,
                                            size_t max_run) {
  std::vector<std::u32string> out;
  for (size_t i = 0; i < text.size(); i += max_slice) {
    const std::u32string s = text.substr(i, max_slice);
    size_t current_len = 0;
    bool current_is_space = !s.empty() && IsPythonSpace(s[0]);
    size_t slice_start = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      const bool is_now_space = IsPythonSpace(s[k]);
      if (current_is_space ^ is_now_space) {
        current_len = 1;
        current_is_space = is_now_space;
      } else {
        current_len += 1;
        if (current_len > max_run) {
          out.push_back(s.substr(slice_start, k - slice_start));
          slice_start = k;
          current_len = 1;
        }
      }
    }
    out.push_back(s.substr(slice_start));
  }
  return out;
}

std::string ToUtf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) out += tokenizer_testing::Utf8(c);
  return out;
}

TEST(ChunkTextTest, MatchesTheOfficialAlgorithmOnRandomText) {
  const std::u32string alphabet = U"ab \n\t中\u3000\u00a0😀\u001c";
  uint64_t state = 12345;
  const auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return state >> 33;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t len = next() % 60;
    std::u32string text;
    for (size_t i = 0; i < len; ++i) {
      // Long runs of one class are what the splitting is about.
      const char32_t c = alphabet[next() % alphabet.size()];
      const size_t repeat = 1 + next() % 6;
      text.append(repeat, c);
    }
    const size_t max_slice = 1 + next() % 40;
    const size_t max_run = 1 + next() % 8;
    std::vector<std::string> expected;
    for (const std::u32string& piece : ReferenceChunks(text, max_slice, max_run)) {
      if (!piece.empty()) expected.push_back(ToUtf8(piece));
    }
    const std::string utf8 = ToUtf8(text);
    std::vector<std::string_view> chunks;
    ChunkText(utf8, max_slice, max_run, &chunks);
    std::vector<std::string> actual(chunks.begin(), chunks.end());
    ASSERT_EQ(actual, expected) << "trial " << trial << " slice " << max_slice << " run "
                                << max_run;
  }
}

TEST(ChunkTextTest, OfficialLimits) {
  std::vector<std::string_view> chunks;
  const std::string letters(25001, 'a');
  ChunkText(letters, kMaxSliceChars, kMaxRunChars, &chunks);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].size(), 25000u);
  EXPECT_EQ(chunks[1].size(), 1u);

  chunks.clear();
  std::string mixed;
  for (int i = 0; i < 250000; ++i) mixed += "ab ";  // short runs, 750,000 characters
  ChunkText(mixed, kMaxSliceChars, kMaxRunChars, &chunks);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].size(), 400000u);
  EXPECT_EQ(chunks[1].size(), 350000u);

  // Characters, not bytes: 25,000 three-byte characters fit in one piece.
  chunks.clear();
  std::string han;
  for (int i = 0; i < 25000; ++i) han += "中";
  ChunkText(han, kMaxSliceChars, kMaxRunChars, &chunks);
  EXPECT_EQ(chunks.size(), 1u);
  han += "中";
  chunks.clear();
  ChunkText(han, kMaxSliceChars, kMaxRunChars, &chunks);
  EXPECT_EQ(chunks.size(), 2u);
}

}  // namespace
}  // namespace k3::tokenizer_internal
