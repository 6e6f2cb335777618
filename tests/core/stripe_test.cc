#include "core/checkpoint/stripe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
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

  StripePlan Plan(const std::vector<double>& weights) {
    auto plan = PlanStripes(*ckpt_, weights);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *std::move(plan) : StripePlan{};
  }

  std::vector<std::string> Dirs(int n) const {
    std::vector<std::string> dirs;
    for (int d = 0; d < n; ++d) dirs.push_back(out_ / absl::StrCat("drive", d));
    return dirs;
  }

  // Stripes the model over `weights.size()` directories.
  std::vector<std::string> Stripe(const std::vector<double>& weights) {
    const auto dirs = Dirs(static_cast<int>(weights.size()));
    absl::Status s = WriteStripes(*ckpt_, Plan(weights), dirs);
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
    EXPECT_EQ(m["version"], 1);
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
  EditManifest(dirs[1], [](ojson& j) { j["version"] = 2; });
  EXPECT_THAT(LoadError(dirs, absl::StatusCode::kInvalidArgument),
              AllOf(HasSubstr(Manifest(dirs[1])), HasSubstr("version")));
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
