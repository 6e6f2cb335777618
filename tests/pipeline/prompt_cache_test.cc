// The prompt cache store: what is stored comes back bit for bit, only as a proper prefix and
// the longest one; the index survives a restart; every kind of damaged file (cut, flipped,
// foreign, of another version, under another name, left by a killed writer) is one warning, a
// miss or a fall back to a shorter entry, and no obstacle to storing again; a full or failing
// disk never fails the caller; eviction keeps the bound and the LRU order; two writers of one
// key leave one file; the fingerprint tells two checkpoints of other weights apart.
#include "pipeline/prompt_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/synth/synth.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace prompt_cache_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::SizeIs;

constexpr char kFingerprint[] = "00112233445566778899aabbccddeeff";

const ModelConfig& Tiny() {
  static const ModelConfig* const kConfig = [] {
    auto c = SynthPresetConfig("tiny");
    EXPECT_TRUE(c.ok()) << c.status();
    return new ModelConfig(*std::move(c));
  }();
  return *kConfig;
}

std::vector<int32_t> Ids(int32_t first, size_t n) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), first);
  return ids;
}

std::vector<int32_t> Plus(std::vector<int32_t> ids, std::vector<int32_t> more) {
  ids.insert(ids.end(), more.begin(), more.end());
  return ids;
}

// A state after `tokens` whose every float is random.
SequenceState RandomState(const std::vector<int32_t>& tokens, uint32_t seed = 1) {
  SequenceState s(Tiny());
  s.AppendTokens(tokens);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  auto fill = [&](std::span<float> v) {
    for (float& x : v) x = u(rng);
  };
  for (int64_t l = 0; l < Tiny().num_layers; ++l) {
    if (Tiny().attention_kind(l) == AttentionKind::kMla) {
      s.mla_cache(l).resize(tokens.size() * s.latent_width());
      fill(s.mla_cache(l));
    } else {
      fill(s.kda_state(l));
      for (int which = 0; which < 3; ++which) fill(s.conv_history(l, which));
    }
  }
  return s;
}

// Serialize() holds the tokens and every float's bits: equal bytes, equal states.
void ExpectSameState(const std::optional<SequenceState>& got, const SequenceState& want) {
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->tokens(), want.tokens());
  EXPECT_TRUE(got->Serialize() == want.Serialize()) << "a float differs";
}

uint64_t HeaderBytes(size_t tokens) { return 40 + sizeof(kFingerprint) - 1 + 4 * tokens; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

// The names in a cache directory that contain `part`.
std::vector<std::string> FilesWith(const std::string& dir, std::string_view part) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(part) != std::string::npos) names.push_back(name);
  }
  return names;
}

class PromptCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<PromptCache> Open(PromptCacheOptions options = {},
                                    std::string fingerprint = kFingerprint) {
    if (options.dir.empty()) options.dir = root_.path();
    auto cache = PromptCache::Open(Tiny(), std::move(fingerprint), std::move(options),
                                   [this](std::string_view line) { warnings_.emplace_back(line); });
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  testing::TempDir root_;
  std::vector<std::string> warnings_;
};

TEST_F(PromptCacheTest, StoredStateComesBackBitForBit) {
  auto cache = Open();
  const SequenceState stored = RandomState(Ids(1, 5));
  cache->Store(stored);
  ExpectSameState(cache->Lookup(Plus(Ids(1, 5), {42, 43})), stored);
  EXPECT_EQ(cache->stats().disk_hits, 1);
  EXPECT_EQ(cache->stats().stored, 1);
  EXPECT_EQ(cache->disk_bytes(), fs::file_size(cache->PathFor(stored.tokens())));
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(PromptCacheTest, OnlyAProperPrefixIsAHit) {
  auto cache = Open({.memory_states = 2});
  cache->Store(RandomState(Ids(1, 5)));
  EXPECT_FALSE(cache->Lookup(Ids(1, 5)).has_value());  // no token left to run
  EXPECT_FALSE(cache->Lookup(Ids(1, 4)).has_value());
  EXPECT_FALSE(cache->Lookup(std::vector<int32_t>{1, 2, 9, 4, 5, 6}).has_value());
  EXPECT_FALSE(cache->Lookup({}).has_value());
  EXPECT_EQ(cache->stats().misses, 4);
  EXPECT_EQ(cache->stats().lookups, 4);
}

TEST_F(PromptCacheTest, TheLongestPrefixWins) {
  auto cache = Open();
  std::vector<SequenceState> states;
  for (size_t n : {3, 8, 5}) states.push_back(RandomState(Ids(1, n), n));
  for (const auto& s : states) cache->Store(s);
  ExpectSameState(cache->Lookup(Ids(1, 7)), states[2]);
  ExpectSameState(cache->Lookup(Ids(1, 20)), states[1]);
  ExpectSameState(cache->Lookup(Ids(1, 4)), states[0]);
}

TEST_F(PromptCacheTest, MemoryServesFirstHoldsItsCountAndTakesInDiskHits) {
  const SequenceState a = RandomState(Ids(1, 4), 1), b = RandomState(Ids(100, 4), 2);
  {
    auto cache = Open({.memory_states = 1});
    cache->Store(a);
    cache->Store(b);
    for (const auto& name : FilesWith(cache->directory(), ".k3pc")) {
      fs::remove(cache->directory() + "/" + name);
    }
    EXPECT_FALSE(cache->Lookup(Plus(a.tokens(), {7})).has_value());  // out of memory: b came in
    ExpectSameState(cache->Lookup(Plus(b.tokens(), {7})), b);
    EXPECT_EQ(cache->stats().memory_hits, 1);
  }
  auto cache = Open({.memory_states = 1});
  cache->Store(a);
  auto again = Open({.memory_states = 1});
  ExpectSameState(again->Lookup(Plus(a.tokens(), {7})), a);
  fs::remove(again->PathFor(a.tokens()));
  ExpectSameState(again->Lookup(Plus(a.tokens(), {8})), a);
  EXPECT_EQ(again->stats().disk_hits, 1);
  EXPECT_EQ(again->stats().memory_hits, 1);
}

TEST_F(PromptCacheTest, ARestartFindsTheStatesOnDisk) {
  const SequenceState a = RandomState(Ids(1, 300), 3), b = RandomState(Ids(1, 6), 4);
  Open()->Store(a);
  Open()->Store(b);
  auto cache = Open();
  EXPECT_EQ(cache->disk_bytes(),
            fs::file_size(cache->PathFor(a.tokens())) + fs::file_size(cache->PathFor(b.tokens())));
  ExpectSameState(cache->Lookup(Ids(1, 301)), a);
  ExpectSameState(cache->Lookup(Ids(1, 7)), b);
  EXPECT_EQ(cache->stats().disk_hits, 2);
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(PromptCacheTest, AStateOnDiskIsNotWrittenAgain) {
  auto cache = Open();
  const SequenceState a = RandomState(Ids(1, 5));
  cache->Store(a);
  struct stat before {
  }, after{};
  ASSERT_EQ(::stat(cache->PathFor(a.tokens()).c_str(), &before), 0);
  cache->Store(a);
  Open()->Store(a);
  EXPECT_EQ(cache->stats().stored, 1);
  ASSERT_EQ(::stat(cache->PathFor(a.tokens()).c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_THAT(FilesWith(cache->directory(), ".k3pc"), SizeIs(1));
}

// The damaged-file catalogue. A good entry and a longer victim are stored; the victim's file is
// damaged; then, with the cache that wrote them still open or with a new one (a restart), a
// lookup that both precede falls back to the good entry with one warning naming the file, and
// the victim can be stored and found again.
class DamagedFileTest : public PromptCacheTest {
 protected:
  const SequenceState good_ = RandomState(Ids(1, 3), 10);
  const SequenceState victim_ = RandomState(Ids(1, 6), 11);
  const std::vector<int32_t> request_ = Ids(1, 9);

  void ExpectHandled(const std::function<void(const std::string&)>& damage, std::string_view what) {
    for (bool restart : {false, true}) {
      SCOPED_TRACE(restart ? "after a restart" : "while open");
      fs::remove_all(root_.path() + "/" + kFingerprint);
      warnings_.clear();
      auto cache = Open();
      cache->Store(good_);
      cache->Store(victim_);
      const std::string path = cache->PathFor(victim_.tokens());
      damage(path);
      if (restart) cache = Open();
      ExpectSameState(cache->Lookup(request_), good_);
      ASSERT_THAT(warnings_, SizeIs(1));
      EXPECT_THAT(warnings_[0], HasSubstr(path));
      EXPECT_THAT(warnings_[0], HasSubstr(what));
      EXPECT_EQ(cache->stats().damaged, 1);
      EXPECT_FALSE(fs::exists(path));
      cache->Store(victim_);
      ExpectSameState(cache->Lookup(request_), victim_);
      EXPECT_THAT(warnings_, SizeIs(1));
    }
  }
};

TEST_F(DamagedFileTest, FileCutAtSeveralOffsets) {
  const uint64_t header = HeaderBytes(victim_.tokens().size());
  const uint64_t size = header + victim_.SerializedBytes() + 8;
  for (uint64_t at : {uint64_t{5}, uint64_t{14}, uint64_t{30}, header - 20, header - 4, header + 3,
                      header + 5000, size - 8, size - 1}) {
    SCOPED_TRACE(at);
    ExpectHandled([&](const std::string& path) { fs::resize_file(path, at); }, "truncated");
  }
}

TEST_F(DamagedFileTest, ZeroLengthFile) {
  ExpectHandled([](const std::string& path) { fs::resize_file(path, 0); }, "0 bytes");
}

TEST_F(DamagedFileTest, OneFlippedPayloadByte) {
  const uint64_t at = HeaderBytes(victim_.tokens().size()) + victim_.SerializedBytes() / 2;
  ExpectHandled(
      [&](const std::string& path) {
        std::string bytes = ReadFile(path);
        bytes[at] ^= 0x10;
        WriteFile(path, bytes);
      },
      "checksum");
}

TEST_F(DamagedFileTest, AFlippedTokenInTheHeader) {
  ExpectHandled(
      [&](const std::string& path) {
        std::string bytes = ReadFile(path);
        bytes[HeaderBytes(2) - 16] ^= 1;  // the third token
        WriteFile(path, bytes);
      },
      "checksum");
}

TEST_F(DamagedFileTest, AnotherFingerprintsFile) {
  testing::TempDir other_root;
  auto other = Open({.dir = other_root.path()}, "ffeeddccbbaa99887766554433221100");
  other->Store(victim_);
  ExpectHandled(
      [&](const std::string& path) {
        fs::copy_file(other->PathFor(victim_.tokens()), path, fs::copy_options::overwrite_existing);
      },
      "another checkpoint");
}

TEST_F(DamagedFileTest, AnOlderAndANewerFormatVersion) {
  for (uint32_t version : {kPromptCacheVersion - 1, kPromptCacheVersion + 1}) {
    ExpectHandled(
        [&](const std::string& path) {
          std::string bytes = ReadFile(path);
          std::memcpy(bytes.data() + 8, &version, 4);
          WriteFile(path, bytes);
        },
        absl::StrCat("format version ", version));
  }
}

TEST_F(DamagedFileTest, StoredTokensDifferFromTheKey) {
  testing::TempDir other_root;
  auto other = Open({.dir = other_root.path()});
  const SequenceState impostor = RandomState({1, 2, 3, 4, 5, 99}, 12);
  other->Store(impostor);
  ExpectHandled(
      [&](const std::string& path) {
        fs::copy_file(other->PathFor(impostor.tokens()), path,
                      fs::copy_options::overwrite_existing);
      },
      "other tokens than its name says");
}

TEST_F(PromptCacheTest, ATempFileOfAKilledWriterIsRemovedAndOneOfALiveWriterKept) {
  const SequenceState a = RandomState(Ids(1, 5));
  std::string dead, live;
  {
    auto cache = Open();
    cache->Store(a);
    const std::string path = cache->PathFor(a.tokens());
    dead = path + ".tmp.4000000.0";
    live = path + ".tmp.4000000.1";
  }
  WriteFile(dead, ReadFile(dead.substr(0, dead.find(".tmp."))).substr(0, 100));
  WriteFile(live, "being written");
  const int writer = ::open(live.c_str(), O_RDONLY);
  ASSERT_EQ(::flock(writer, LOCK_EX), 0);
  auto cache = Open();
  ::close(writer);
  ASSERT_THAT(warnings_, SizeIs(1));
  EXPECT_THAT(warnings_[0], HasSubstr(dead));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(cache->stats().damaged, 1);
  ExpectSameState(cache->Lookup(Ids(1, 6)), a);
  const SequenceState b = RandomState(Ids(50, 5), 2);
  cache->Store(b);
  ExpectSameState(cache->Lookup(Ids(50, 6)), b);
}

// Writes that fail while `failing` (pause_stores 2): one warning saying `error`, no file left,
// a pause, then writing again; the entries on disk stay usable throughout.
void ExpectWriteFailureHandled(const std::vector<std::string>& warnings, PromptCache& cache,
                               bool& failing, const SequenceState& big, std::string_view error) {
  const SequenceState a = RandomState(Ids(1, 5), 1);
  cache.Store(a);
  failing = true;
  for (int i = 0; i < 6; ++i) cache.Store(big);  // fails, 2 paused, fails again, 2 paused
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_THAT(warnings[0], HasSubstr(error));
  EXPECT_EQ(cache.stats().store_failures, 2);
  EXPECT_EQ(cache.stats().stored, 1);
  EXPECT_THAT(FilesWith(cache.directory(), ".tmp."), SizeIs(0));
  EXPECT_FALSE(fs::exists(cache.PathFor(big.tokens())));
  ExpectSameState(cache.Lookup(Ids(1, 7)), a);
  failing = false;
  cache.Store(big);
  EXPECT_EQ(cache.stats().stored, 2);
  ExpectSameState(cache.Lookup(Plus(big.tokens(), {1})), big);
  EXPECT_THAT(warnings, SizeIs(1));
}

TEST_F(PromptCacheTest, NoSpaceLeftWarnsOnceAndPauses) {
  bool failing = false;
  auto cache =
      Open({.pause_stores = 2, .write_fault = [&](uint64_t) { return failing ? ENOSPC : 0; }});
  ExpectWriteFailureHandled(warnings_, *cache, failing, RandomState(Ids(500, 7), 3), "No space");
}

TEST_F(PromptCacheTest, AnIoErrorMidFileLeavesNoPartialFile) {
  bool failing = false;
  auto cache = Open({.pause_stores = 2, .write_fault = [&](uint64_t offset) {
                       return failing && offset > 0 ? EIO : 0;
                     }});
  // 2,048 tokens make a file of more than one write (1 MiB).
  ExpectWriteFailureHandled(warnings_, *cache, failing, RandomState(Ids(500, 2048), 3),
                            "Input/output error");
}

TEST_F(PromptCacheTest, AFullFileSystem) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string mount = root_.path() + "/small";
  fs::create_directory(mount);
  // 24 pages: one tiny state's file (15 pages) fits, a second does not.
  if (::mount("tmpfs", mount.c_str(), "tmpfs", 0, "size=96k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs: " << std::strerror(errno);
  }
  struct Unmount {
    const std::string& path;
    ~Unmount() { EXPECT_EQ(::umount(path.c_str()), 0) << std::strerror(errno); }
  } unmount{mount};
  {
    auto cache = Open({.dir = mount});
    const SequenceState a = RandomState(Ids(1, 5), 1), b = RandomState(Ids(50, 5), 2);
    cache->Store(a);
    cache->Store(b);
    ASSERT_THAT(warnings_, SizeIs(1));
    EXPECT_THAT(warnings_[0], HasSubstr("no room"));
    EXPECT_EQ(cache->stats().store_failures, 1);
    EXPECT_THAT(FilesWith(cache->directory(), ".tmp."), SizeIs(0));
    ExpectSameState(cache->Lookup(Ids(1, 6)), a);
    EXPECT_FALSE(cache->Lookup(Ids(50, 6)).has_value());
  }
}

TEST_F(PromptCacheTest, EvictionKeepsTheBoundAndTheLeastRecentlyUsedGoes) {
  const SequenceState a = RandomState(Ids(1, 5), 1), b = RandomState(Ids(100, 5), 2),
                      c = RandomState(Ids(200, 5), 3), d = RandomState(Ids(300, 5), 4);
  const uint64_t file = HeaderBytes(5) + a.SerializedBytes() + 8;
  const PromptCacheOptions options{.max_bytes = file * 5 / 2};
  {
    auto cache = Open(options);
    cache->Store(a);
    cache->Store(b);
    ASSERT_TRUE(cache->Lookup(Ids(1, 6)).has_value());  // a is now the more recently used
    cache->Store(c);
    EXPECT_EQ(cache->stats().evicted, 1);
    EXPECT_LE(cache->disk_bytes(), options.max_bytes);
    EXPECT_FALSE(fs::exists(cache->PathFor(b.tokens())));
    EXPECT_FALSE(cache->Lookup(Ids(100, 6)).has_value());
    EXPECT_TRUE(cache->Lookup(Ids(200, 6)).has_value());  // c, then a: a is older again
    EXPECT_TRUE(cache->Lookup(Ids(1, 6)).has_value());
  }
  // The order lives in the files' times: a new process evicts the oldest, c.
  auto cache = Open(options);
  cache->Store(d);
  EXPECT_FALSE(fs::exists(cache->PathFor(c.tokens())));
  EXPECT_TRUE(fs::exists(cache->PathFor(a.tokens())));
  EXPECT_TRUE(fs::exists(cache->PathFor(d.tokens())));
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(PromptCacheTest, TwoWritersOfOneKeyLeaveOneFile) {
  const SequenceState a = RandomState(Ids(1, 5));
  auto second = Open();
  // The first writer's write waits while the second writes and publishes the same state.
  bool raced = false;
  auto first = Open({.write_fault = [&](uint64_t) {
    if (!std::exchange(raced, true)) second->Store(a);
    return 0;
  }});
  first->Store(a);
  EXPECT_TRUE(raced);
  EXPECT_EQ(second->stats().stored, 1);
  EXPECT_EQ(first->stats().stored, 0);
  EXPECT_EQ(first->stats().store_failures, 0);
  EXPECT_THAT(FilesWith(first->directory(), ""), SizeIs(1));
  ExpectSameState(first->Lookup(Ids(1, 6)), a);
  ExpectSameState(second->Lookup(Ids(1, 6)), a);
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(PromptCacheTest, ConcurrentStoresAndLookups) {
  auto cache = Open({.max_bytes = 1 << 20, .memory_states = 2});
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        const SequenceState s = RandomState(Ids(1000 * t + 10 * i, 4), i);
        cache->Store(s);
        ExpectSameState(cache->Lookup(Plus(s.tokens(), {1})), s);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(cache->stats().memory_hits + cache->stats().disk_hits, 8);
  EXPECT_THAT(warnings_, SizeIs(0));
}

TEST_F(PromptCacheTest, OpenRefusesAFingerprintThatIsNotAPlainName) {
  EXPECT_FALSE(PromptCache::Open(Tiny(), "../x", {.dir = root_.path()}).ok());
  EXPECT_FALSE(PromptCache::Open(Tiny(), "", {.dir = root_.path()}).ok());
}

TEST(PromptCacheKeyTest, TheChainTellsEveryPrefixApartAndIsStable) {
  const std::vector<int32_t> ids = Ids(7, 600);
  std::set<std::string> keys;
  for (size_t n : {1, 255, 256, 257, 512, 513, 600}) {
    const std::string key = PromptCacheKey(kFingerprint, std::span(ids).first(n));
    EXPECT_EQ(key.size(), 32u);
    EXPECT_EQ(key, PromptCacheKey(kFingerprint, std::span(ids).first(n)));
    keys.insert(key);
  }
  EXPECT_THAT(keys, SizeIs(7));
  EXPECT_NE(PromptCacheKey(kFingerprint, ids), PromptCacheKey("another", ids));
}

TEST(PromptCacheFingerprintTest, OtherWeightsDifferTheSameCheckpointIsEqual) {
  testing::TempDir dir;
  std::vector<std::string> fingerprints;
  for (uint64_t seed : {0, 1}) {
    SynthOptions o;
    o.preset = "tiny";
    o.seed = seed;
    o.out_dir = dir / absl::StrCat("seed", seed);
    ASSERT_TRUE(Synthesize(o).ok());
    for (int twice = 0; twice < 2; ++twice) {
      auto ckpt = Checkpoint::Open(o.out_dir);
      ASSERT_TRUE(ckpt.ok()) << ckpt.status();
      auto fp = PromptCacheFingerprint(**ckpt);
      ASSERT_TRUE(fp.ok()) << fp.status();
      EXPECT_THAT(*fp, SizeIs(32));
      fingerprints.push_back(*fp);
    }
  }
  EXPECT_EQ(fingerprints[0], fingerprints[1]);
  EXPECT_EQ(fingerprints[2], fingerprints[3]);
  EXPECT_NE(fingerprints[0], fingerprints[2]);
}

}  // namespace
}  // namespace prompt_cache_test
}  // namespace k3
