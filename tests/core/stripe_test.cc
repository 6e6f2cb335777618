#include "core/checkpoint/stripe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/synth/synth.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ojson = nlohmann::ordered_json;

// The tiny model with 64 experts a layer (12 MoE layers), and a second one of the same config
// from another seed; each test stripes into directories of its own.
class StripeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    models_ = new testing::TempDir();
    for (uint64_t seed : {11, 12}) {
      SynthOptions opt = testing::TinyModel(ModelDir(seed));
      opt.seed = seed;
      opt.overrides = {{"num_experts", "64"}};
      auto r = Synthesize(opt);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }
  static void TearDownTestSuite() {
    delete models_;
    models_ = nullptr;
  }
  static std::string ModelDir(uint64_t seed) { return *models_ / absl::StrCat("seed", seed); }

  void SetUp() override {
    auto ckpt = Checkpoint::Open(ModelDir(11));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
  }

  StripePlan Plan(const std::vector<double>& weights, int copies = 1,
                  StripeLayout layout = StripeLayout::kExperts) {
    auto plan = PlanStripes(*ckpt_, weights, copies, layout);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *std::move(plan) : StripePlan{};
  }

  std::vector<std::string> Dirs(int n) const {
    std::vector<std::string> dirs;
    for (int d = 0; d < n; ++d) dirs.push_back(out_ / absl::StrCat("drive", d));
    return dirs;
  }

  // Stripes the model over `weights.size()` directories.
  std::vector<std::string> Stripe(const std::vector<double>& weights, int copies = 1,
                                  StripeLayout layout = StripeLayout::kExperts) {
    const auto dirs = Dirs(static_cast<int>(weights.size()));
    absl::Status s = WriteStripes(*ckpt_, Plan(weights, copies, layout), dirs);
    EXPECT_TRUE(s.ok()) << s;
    return dirs;
  }

  static std::string DataFile(const std::string& dir) { return dir + "/" + kStripeDataFile; }
  static std::string Manifest(const std::string& dir) { return dir + "/" + kStripeManifestFile; }

  static ojson ReadManifest(const std::string& dir) {
    auto text = io::ReadFileToString(Manifest(dir));
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? ojson::parse(*text) : ojson();
  }

  static void EditManifest(const std::string& dir, const std::function<void(ojson&)>& edit) {
    ojson j = ReadManifest(dir);
    edit(j);
    ASSERT_TRUE(io::WriteFileAtomically(Manifest(dir), j.dump(1)).ok());
  }

  // The manifest's extents of a directory, in data file order.
  static std::vector<ojson> ExtentsByPlace(const std::string& dir) {
    std::vector<ojson> extents;
    const ojson m = ReadManifest(dir);
    for (const ojson& s : m["shards"]) {
      for (const ojson& e : s["extents"]) extents.push_back(e);
    }
    std::sort(extents.begin(), extents.end(), [](const ojson& a, const ojson& b) {
      return a["at"].get<uint64_t>() < b["at"].get<uint64_t>();
    });
    return extents;
  }

  static void FlipByte(const std::string& path, uint64_t at) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char c = static_cast<char>(f.get() ^ 0x01);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(c);
  }

  std::string LoadError(const std::vector<std::string>& dirs, absl::StatusCode code) {
    auto extents = LoadStripes(*ckpt_, dirs);
    EXPECT_FALSE(extents.ok()) << "damaged stripes loaded";
    if (extents.ok()) return "";
    EXPECT_EQ(extents.status().code(), code) << extents.status();
    return std::string(extents.status().message());
  }

  static inline testing::TempDir* models_ = nullptr;
  std::unique_ptr<Checkpoint> ckpt_;
  testing::TempDir out_;
};

TEST_F(StripeTest, EveryLayerIsOnEveryDirectoryWithinFivePercentOfItsWeight) {
  const ModelConfig& c = ckpt_->config();
  const uint64_t expert_bytes = ckpt_->expert(1, 0).total_bytes;
  for (const std::vector<double>& weights :
       std::vector<std::vector<double>>{{1, 1, 1}, {2, 1, 0.2}, {1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(weights));
    const StripePlan plan = Plan(weights);
    ASSERT_EQ(plan.directories(), static_cast<int>(weights.size()));
    const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
    for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
      uint64_t layer_total = 0;
      for (uint64_t b : plan.layer_bytes[l]) layer_total += b;
      ASSERT_EQ(layer_total, expert_bytes * c.num_experts) << "layer " << l;
      for (int d = 0; d < plan.directories(); ++d) {
        const double want = weights[d] / sum;
        const double got = static_cast<double>(plan.layer_bytes[l][d]) / layer_total;
        EXPECT_GT(plan.layer_bytes[l][d], 0u) << "layer " << l << " dir " << d;
        EXPECT_LE(std::abs(got - want), 0.05 * want) << "layer " << l << " dir " << d;
        // Within one expert of the exact share.
        EXPECT_LT(std::abs(got - want) * layer_total, static_cast<double>(expert_bytes));
      }
    }
    for (const StripeShare& s : StripeShares(plan)) {
      EXPECT_EQ(s.layers_without, 0);
      EXPECT_LE(std::abs(s.min_layer_share - s.weight_share), 0.05 * s.weight_share);
      EXPECT_LE(std::abs(s.max_layer_share - s.weight_share), 0.05 * s.weight_share);
      EXPECT_LE(std::abs(s.share - s.weight_share), 0.05 * s.weight_share);
    }
    EXPECT_EQ(plan.unstriped, 0);
    for (int64_t e = 0; e < c.num_experts; ++e) EXPECT_EQ(plan.DirOf(0, e), -1);  // dense
  }
}

TEST_F(StripeTest, ConsecutiveExpertsAlternateDirectoriesAndRoundingRotates) {
  const ModelConfig& c = ckpt_->config();
  const StripePlan even = Plan({1, 1});
  const StripePlan three = Plan({1, 1, 1});
  const StripePlan skewed = Plan({2, 1, 0.2});
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    int run = 1, longest = 1;
    for (int64_t e = 1; e < c.num_experts; ++e) {
      EXPECT_NE(even.DirOf(l, e), even.DirOf(l, e - 1)) << "layer " << l << " expert " << e;
      EXPECT_NE(three.DirOf(l, e), three.DirOf(l, e - 1)) << "layer " << l << " expert " << e;
      run = skewed.DirOf(l, e) == skewed.DirOf(l, e - 1) ? run + 1 : 1;
      longest = std::max(longest, run);
    }
    EXPECT_LE(longest, 2) << "layer " << l;  // weight 2 of 3.2: never three in a row
  }
  // 64 experts over three: one directory takes 22 in each layer, a different one each layer,
  // so over the 12 layers the totals are equal.
  const auto shares = StripeShares(three);
  EXPECT_EQ(shares[0].bytes, shares[1].bytes);
  EXPECT_EQ(shares[1].bytes, shares[2].bytes);
  // Deterministic.
  EXPECT_EQ(Plan({2, 1, 0.2}).dir, skewed.dir);
}

TEST_F(StripeTest, BadWeightsAreRefused) {
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{
           {}, {1, 0}, {1, -1}, {1, std::nan("")}, {1, INFINITY}, std::vector<double>(65, 1)}) {
    auto plan = PlanStripes(*ckpt_, weights);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument)
        << ::testing::PrintToString(weights);
  }
}

TEST_F(StripeTest, WrittenStripesLoadWithEveryExpertsBytesOnce) {
  const auto dirs = Stripe({2, 1, 0.2});
  auto extents = LoadStripes(*ckpt_, dirs);
  ASSERT_TRUE(extents.ok()) << extents.status();
  const ModelConfig& c = ckpt_->config();
  ASSERT_EQ(extents->size(), static_cast<size_t>((c.num_layers - 1) * c.num_experts));
  const StripePlan plan = Plan({2, 1, 0.2});
  std::set<std::pair<int64_t, int64_t>> seen;
  std::string last_shard;
  uint64_t last_offset = 0;
  for (const StripeExtent& e : *extents) {
    SCOPED_TRACE(absl::StrCat("layer ", e.layer, " expert ", e.expert));
    EXPECT_TRUE(seen.insert({e.layer, e.expert}).second);
    const ByteSpan span = ckpt_->expert(e.layer, e.expert).spans[0];
    EXPECT_EQ(e.shard, std::filesystem::path(ckpt_->shard_paths()[span.shard]).filename().string());
    EXPECT_EQ(e.offset, span.offset);
    EXPECT_EQ(e.length, span.length);
    EXPECT_EQ(e.path, DataFile(dirs[plan.DirOf(e.layer, e.expert)]));
    EXPECT_EQ(e.at % 4096, e.offset % 4096);
    EXPECT_TRUE(e.shard > last_shard || (e.shard == last_shard && e.offset > last_offset));
    last_shard = e.shard;
    last_offset = e.offset;
    std::vector<uint8_t> want(e.length), got(e.length);
    ASSERT_TRUE(ckpt_->ReadSpan(span, want).ok());
    auto file = io::RandomAccessFile::Open(e.path);
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->ReadAt(e.at, got).ok());
    EXPECT_TRUE(want == got);
    EXPECT_EQ(e.crc, Crc32c(0, want.data(), want.size()));
  }
  for (int d = 0; d < 3; ++d) {
    const ojson m = ReadManifest(dirs[d]);
    EXPECT_EQ(m["format"], "k3-stripe");
    EXPECT_EQ(m["version"], kStripeVersion);
    EXPECT_EQ(m["layout"], "experts");
    EXPECT_EQ(m["fingerprint"], ckpt_->config().Fingerprint());
    EXPECT_EQ(m["directory"], d);
    EXPECT_EQ(m["directories"], 3);
    EXPECT_EQ(m["weights"], ojson({2.0, 1.0, 0.2}));
    EXPECT_EQ(m["files"][0]["bytes"].get<uint64_t>(),
              std::filesystem::file_size(DataFile(dirs[d])));
  }
  uint64_t last = 0, total = 0;
  ASSERT_TRUE(VerifyStripes(*ckpt_, dirs, [&](uint64_t done, uint64_t all) {
                EXPECT_GT(done, last);
                last = done;
                total = all;
              }).ok());
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, plan.TotalBytes());
}

TEST_F(StripeTest, CopiesGoToDistinctDirectoriesEachKTimesItsWeightShareCapped) {
  const ModelConfig& c = ckpt_->config();
  const uint64_t expert_bytes = ckpt_->expert(1, 0).total_bytes;
  struct Case {
    std::vector<double> weights;
    int copies;
    std::vector<double> target;  // of one copy of the layer's experts
  };
  for (const Case& k :
       std::vector<Case>{{{1, 1, 1}, 2, {2.0 / 3, 2.0 / 3, 2.0 / 3}},
                         {{2, 1, 1}, 2, {1, 0.5, 0.5}},
                         {{4, 1, 1}, 2, {1, 0.5, 0.5}},  // 4/3 capped
                         {{1, 1, 1}, 3, {1, 1, 1}},
                         {{2, 1, 0.2, 1}, 3, {1, 10.0 / 11, 2.0 / 11, 10.0 / 11}}}) {
    SCOPED_TRACE(absl::StrCat(::testing::PrintToString(k.weights), " x ", k.copies));
    const StripePlan plan = Plan(k.weights, k.copies);
    const int n = plan.directories();
    ASSERT_EQ(plan.copies, k.copies);
    EXPECT_EQ(plan.StripedExperts(), (c.num_layers - 1) * c.num_experts);
    const StripePlan single = Plan(k.weights);
    for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
      std::vector<int64_t> count(n, 0);
      std::vector<std::vector<int64_t>> shared(n, std::vector<int64_t>(n, 0));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::vector<int> dirs = plan.DirsOf(l, e);
        ASSERT_EQ(dirs.size(), static_cast<size_t>(k.copies));
        EXPECT_EQ(std::set<int>(dirs.begin(), dirs.end()).size(), dirs.size())
            << "layer " << l << " expert " << e << ": " << ::testing::PrintToString(dirs);
        EXPECT_EQ(dirs[0], single.DirOf(l, e)) << "the first copy is placed as with one";
        for (int d : dirs) {
          ASSERT_GE(d, 0);
          ASSERT_LT(d, n);
          EXPECT_TRUE(plan.Holds(d, l, e));
          ++count[d];
          for (int o : dirs) shared[d][o] += d != o ? 1 : 0;
        }
      }
      for (int d = 0; d < n; ++d) {
        EXPECT_GT(count[d], 0) << "layer " << l << " dir " << d;
        EXPECT_EQ(plan.layer_bytes[l][d], count[d] * expert_bytes);
        // Within one expert of K x its weight share, capped at every expert.
        EXPECT_LT(std::abs(static_cast<double>(count[d]) - k.target[d] * c.num_experts), 1.0)
            << "layer " << l << " dir " << d << ": " << count[d];
        // Every pair shares experts, unless one directory holds them all (the others' copies
        // are then their second ones).
        const bool one_full = *std::max_element(k.target.begin(), k.target.end()) == 1;
        for (int o = 0; o < n && !one_full; ++o) {
          if (o != d) {
            EXPECT_GT(shared[d][o], 0) << "layer " << l << " dirs " << d << "," << o;
          }
        }
      }
    }
    for (int d = 0; d < n; ++d) {
      const StripeShare s = StripeShares(plan)[d];
      EXPECT_NEAR(s.target, k.target[d], 1e-9);
      EXPECT_EQ(s.layers_without, 0);
      EXPECT_LE(std::abs(s.share - s.target), 0.05 * s.target);
      EXPECT_LE(std::abs(s.min_layer_share - s.target), 0.05 * s.target);
      EXPECT_LE(std::abs(s.max_layer_share - s.target), 0.05 * s.target);
    }
    EXPECT_EQ(Plan(k.weights, k.copies).dir, plan.dir);  // deterministic
  }
}

TEST_F(StripeTest, TheExpertsTwoDirectoriesShareAreSpreadOverTheIds) {
  // Three equal drives, two copies: each pair shares a third of a layer, never a long run of ids.
  const ModelConfig& c = ckpt_->config();
  const StripePlan plan = Plan({1, 1, 1}, 2);
  for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
    std::map<std::pair<int, int>, int64_t> pairs;
    int run = 1, longest = 1;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      std::vector<int> dirs = plan.DirsOf(l, e);
      std::sort(dirs.begin(), dirs.end());
      ++pairs[{dirs[0], dirs[1]}];
      if (e > 0) {
        std::vector<int> before = plan.DirsOf(l, e - 1);
        std::sort(before.begin(), before.end());
        run = before == dirs ? run + 1 : 1;
        longest = std::max(longest, run);
      }
    }
    ASSERT_EQ(pairs.size(), 3u) << "layer " << l;
    for (const auto& [pair, n] : pairs) {
      EXPECT_NEAR(static_cast<double>(n), c.num_experts / 3.0, 2.0) << "layer " << l;
    }
    EXPECT_LE(longest, 2) << "layer " << l;
  }
}

TEST_F(StripeTest, EveryCopyCountPlansDistinctDirectoriesForSkewedWeights) {
  const ModelConfig& c = ckpt_->config();
  for (const std::vector<double>& weights : std::vector<std::vector<double>>{
           {100, 1, 1, 1}, {1, 0.01}, {1, 2, 3, 4, 5}, {0.3, 7, 0.3}}) {
    for (int copies = 1; copies <= static_cast<int>(weights.size()); ++copies) {
      SCOPED_TRACE(absl::StrCat(::testing::PrintToString(weights), " x ", copies));
      const StripePlan plan = Plan(weights, copies);
      for (int64_t l = c.first_k_dense_replace; l < c.num_layers; ++l) {
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::vector<int> dirs = plan.DirsOf(l, e);
          ASSERT_EQ(std::set<int>(dirs.begin(), dirs.end()).size(), dirs.size());
          ASSERT_GE(*std::min_element(dirs.begin(), dirs.end()), 0);
        }
      }
    }
  }
}

TEST_F(StripeTest, CopiesOutsideOneToTheDirectoriesAreRefused) {
  for (int copies : {0, -1, 4}) {
    auto plan = PlanStripes(*ckpt_, {1, 1, 1}, copies);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << copies;
  }
}

TEST_F(StripeTest, WrittenCopiesLoadWithEveryExpertKTimes) {
  for (const std::vector<double>& weights :
       std::vector<std::vector<double>>{{1, 1, 1}, {2, 1, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(weights));
    const auto dirs = Stripe(weights, 2);
    const StripePlan plan = Plan(weights, 2);
    auto extents = LoadStripes(*ckpt_, dirs);
    ASSERT_TRUE(extents.ok()) << extents.status();
    const ModelConfig& c = ckpt_->config();
    ASSERT_EQ(extents->size(), static_cast<size_t>(2 * (c.num_layers - 1) * c.num_experts));
    std::map<std::pair<int64_t, int64_t>, std::set<std::string>> paths;
    for (const StripeExtent& e : *extents) {
      SCOPED_TRACE(absl::StrCat("layer ", e.layer, " expert ", e.expert));
      EXPECT_TRUE((paths[{e.layer, e.expert}].insert(e.path).second));
      const ByteSpan span = ckpt_->expert(e.layer, e.expert).spans[0];
      EXPECT_EQ(e.offset, span.offset);
      EXPECT_EQ(e.length, span.length);
      EXPECT_EQ(e.at % 4096, e.offset % 4096);
      std::vector<uint8_t> want(e.length), got(e.length);
      ASSERT_TRUE(ckpt_->ReadSpan(span, want).ok());
      auto file = io::RandomAccessFile::Open(e.path);
      ASSERT_TRUE(file.ok());
      ASSERT_TRUE((*file)->ReadAt(e.at, got).ok());
      EXPECT_TRUE(want == got);
      EXPECT_EQ(e.crc, Crc32c(0, want.data(), want.size()));
    }
    ASSERT_EQ(paths.size(), static_cast<size_t>((c.num_layers - 1) * c.num_experts));
    for (const auto& [id, held] : paths) {
      std::set<std::string> want;
      for (int d : plan.DirsOf(id.first, id.second)) want.insert(DataFile(dirs[d]));
      EXPECT_EQ(held, want) << "layer " << id.first << " expert " << id.second;
    }
    for (int d = 0; d < 3; ++d) {
      const ojson m = ReadManifest(dirs[d]);
      EXPECT_EQ(m["copies"], 2);
      EXPECT_EQ(m["directories"], 3);
    }
    EXPECT_TRUE(VerifyStripes(*ckpt_, dirs).ok());
    // A manifest from before copies were recorded reads as one copy.
    EditManifest(dirs[0], [](ojson& j) { j.erase("copies"); });
    EXPECT_TRUE(LoadStripes(*ckpt_, dirs).ok());
  }
}

TEST_F(StripeTest, DirectoriesWithoutAManifestAreIgnored) {
  const auto dirs = Stripe({1, 1});
  testing::TempDir plain;
  auto with_plain = LoadStripes(*ckpt_, {dirs[0], plain.path(), dirs[1]});
  ASSERT_TRUE(with_plain.ok()) << with_plain.status();
  auto only_one = LoadStripes(*ckpt_, {dirs[1]});
  ASSERT_TRUE(only_one.ok()) << only_one.status();
  EXPECT_EQ(only_one->size() * 2, with_plain->size());
  auto none = LoadStripes(*ckpt_, {plain.path()});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_THAT(LoadError({dirs[0], dirs[0] + "/."}, absl::StatusCode::kInvalidArgument),
              HasSubstr("listed twice"));
}

TEST_F(StripeTest, ACorruptedStripeByteIsRefusedNamingTheFileAndOffset) {
  const auto dirs = Stripe({1, 1, 1});
  const std::vector<ojson> extents = ExtentsByPlace(dirs[1]);
  // The middle extent is in LoadStripes' sample; the second is only in VerifyStripes'.
  const uint64_t sampled = extents[extents.size() / 2]["at"].get<uint64_t>();
  const uint64_t other = extents[1]["at"].get<uint64_t>();
  FlipByte(DataFile(dirs[1]), other + 17);
  ASSERT_TRUE(LoadStripes(*ckpt_, dirs).ok());
  absl::Status verified = VerifyStripes(*ckpt_, dirs);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.message(),
              AllOf(HasSubstr(DataFile(dirs[1])), HasSubstr(absl::StrCat("offset ", other))));
  FlipByte(DataFile(dirs[1]), sampled + 5);
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kDataLoss),
              AllOf(HasSubstr(DataFile(dirs[1])), HasSubstr(absl::StrCat("offset ", sampled)),
                    HasSubstr("CRC-32C")));
}

TEST_F(StripeTest, AManifestOfAnotherCheckpointIsRefused) {
  const auto dirs = Stripe({1, 1});
  // Same config, other weights: the sample's source bytes differ.
  auto other = Checkpoint::Open(ModelDir(12));
  ASSERT_TRUE(other.ok()) << other.status();
  auto loaded = LoadStripes(**other, dirs);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(),
              AllOf(HasSubstr(Manifest(dirs[0])), HasSubstr("another checkpoint")));
  // Another config.
  EditManifest(dirs[1], [](ojson& j) { j["fingerprint"] = "0123456789abcdef"; });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[1])), HasSubstr("0123456789abcdef"),
                    HasSubstr("another model")));
}

TEST_F(StripeTest, AMissingOrTruncatedDataFileIsRefused) {
  const auto dirs = Stripe({1, 1});
  std::filesystem::resize_file(DataFile(dirs[0]),
                               std::filesystem::file_size(DataFile(dirs[0])) - 1);
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kDataLoss),
              AllOf(HasSubstr(DataFile(dirs[0])), HasSubstr("truncated")));
  std::filesystem::remove(DataFile(dirs[0]));
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kNotFound),
              AllOf(HasSubstr(DataFile(dirs[0])), HasSubstr("does not exist")));
}

TEST_F(StripeTest, AManifestThatDisagreesWithTheCheckpointNamesTheKey) {
  const auto dirs = Stripe({1, 1});
  EditManifest(dirs[0], [](ojson& j) {
    ojson& e = j["shards"][0]["extents"][3];
    e["at"] = e["at"].get<uint64_t>() + 1;
  });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[0])), HasSubstr("shards[0].extents[3]"),
                    HasSubstr("modulo 4096")));
  Stripe({1, 1});
  EditManifest(dirs[1], [](ojson& j) {
    ojson& e = j["shards"][0]["extents"][0];
    e["offset"] = e["offset"].get<uint64_t>() + 4096;
  });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[1])), HasSubstr("not where the checkpoint has it")));
  Stripe({1, 1});
  EditManifest(dirs[1], [](ojson& j) { j["version"] = kStripeVersion + 1; });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[1])), HasSubstr("version")));
}

TEST(SliceOfTest, PiecesTileTheSpanAt4KiBCutsEachWithin4KiBOfItsWeight) {
  // A released expert's size at an odd offset, and skewed weights.
  const ByteSpan span = {.shard = 3, .offset = 123456789, .length = 17'547'264};
  for (const std::vector<double>& weights :
       std::vector<std::vector<double>>{{1, 1, 1}, {2, 1, 0.2}, {5}, {1, 1e-6, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(weights));
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    uint64_t at = span.offset;
    for (int d = 0; d < static_cast<int>(weights.size()); ++d) {
      const ByteSpan piece = SliceOf(span, weights, d);
      EXPECT_EQ(piece.shard, span.shard);
      EXPECT_EQ(piece.offset, at);
      if (d > 0) {
        EXPECT_EQ(piece.offset % kStripeAlignment, 0u);
      }
      EXPECT_NEAR(static_cast<double>(piece.length),
                  static_cast<double>(span.length) * weights[d] / total, kStripeAlignment);
      at += piece.length;
    }
    EXPECT_EQ(at, span.offset + span.length);
  }
}

TEST_F(StripeTest, SlicesPutAPieceOfEveryExpertOnEveryDirectoryAndLoadByteExact) {
  EXPECT_FALSE(PlanStripes(*ckpt_, {1, 1}, 2, StripeLayout::kSlices).ok());  // one copy only
  const std::vector<double> weights = {2, 1, 1};
  const StripePlan plan = Plan(weights, 1, StripeLayout::kSlices);
  const auto dirs = Stripe(weights, 1, StripeLayout::kSlices);
  auto extents = LoadStripes(*ckpt_, dirs);
  ASSERT_TRUE(extents.ok()) << extents.status();
  // Each expert's pieces, in every directory that has a non-empty one, tile its span.
  std::map<std::pair<int64_t, int64_t>, std::vector<const StripeExtent*>> pieces;
  for (const StripeExtent& e : *extents) pieces[{e.layer, e.expert}].push_back(&e);
  const ModelConfig& c = ckpt_->config();
  ASSERT_EQ(pieces.size(), static_cast<size_t>((c.num_layers - 1) * c.num_experts));
  uint64_t bytes = 0;
  for (const auto& [id, list] : pieces) {
    SCOPED_TRACE(absl::StrCat("layer ", id.first, " expert ", id.second));
    const ByteSpan span = ckpt_->expert(id.first, id.second).spans[0];
    uint64_t at = span.offset;
    for (const StripeExtent* e : list) {
      EXPECT_EQ(e->offset, at);
      at += e->length;
      bytes += e->length;
      std::vector<uint8_t> want(e->length), got(e->length);
      ASSERT_TRUE(ckpt_->ReadSpan({span.shard, e->offset, e->length}, want).ok());
      auto file = io::RandomAccessFile::Open(e->path);
      ASSERT_TRUE(file.ok());
      ASSERT_TRUE((*file)->ReadAt(e->at, got).ok());
      EXPECT_TRUE(want == got);
    }
    EXPECT_EQ(at, span.offset + span.length);
  }
  EXPECT_EQ(bytes, plan.TotalBytes());
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(ReadManifest(dirs[d])["layout"], "slices");
    EXPECT_EQ(ReadManifest(dirs[d])["version"], kStripeVersion);
  }
  EXPECT_TRUE(VerifyStripes(*ckpt_, dirs).ok());
  // A piece recorded as another directory's slice is refused.
  EditManifest(dirs[0], [](ojson& j) { j["weights"] = ojson({1.0, 1.0, 1.0}); });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[0])), HasSubstr("slice")));
}

TEST_F(StripeTest, AVersion1ManifestOfWholeExpertsStillLoads) {
  const auto dirs = Stripe({1, 1});
  for (const std::string& dir : dirs) {
    EditManifest(dir, [](ojson& j) {
      j["version"] = 1;
      j.erase("layout");
    });
  }
  EXPECT_TRUE(LoadStripes(*ckpt_, dirs).ok());
}

TEST_F(StripeTest, RewritingReplacesTheStripesAndAMismatchedPlanIsRefused) {
  auto dirs = Stripe({1, 1, 1});
  dirs = Stripe({1, 3});  // over the first two, with other weights
  auto extents = LoadStripes(*ckpt_, dirs);
  ASSERT_TRUE(extents.ok()) << extents.status();
  EXPECT_EQ(ReadManifest(dirs[1])["weights"], ojson({1.0, 3.0}));
  EXPECT_EQ(WriteStripes(*ckpt_, Plan({1, 1}), Dirs(3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteStripes(*ckpt_, Plan({1, 1}), {dirs[0], dirs[0]}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k3
