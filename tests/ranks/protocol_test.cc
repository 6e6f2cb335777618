// The messages between the ranks (pipeline/ranks/protocol.h): each decodes to what was encoded,
// and a message cut short or garbled is refused with an error saying what is wrong.
#include "pipeline/ranks/protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/ranks/identity.h"

namespace k3::ranks {
namespace {

using ::testing::HasSubstr;

constexpr size_t kLatent = 3;

ModelConfig Config() {
  ModelConfig c;
  c.num_layers = 4;
  c.num_experts = 16;
  c.routed_expert_hidden_size = kLatent;
  return c;
}

// Layer 2: expert 5 multiplies rows 0 and 1, expert 9 row 1.
LayerJob Job() {
  return {.layer = 2,
          .experts = {5, 9},
          .counts = {2, 1},
          .row_of = {0, 1, 1},
          .rows = {1, 2, 3, 4, 5, 6}};
}

TEST(ProtocolTest, ALayerJobRoundTrips) {
  const LayerJob job = Job();
  const std::vector<int64_t> header = EncodeJobHeader(job, kLatent);
  EXPECT_EQ(header, (std::vector<int64_t>{2, 2, 2, 5, 9, 2, 1, 0, 1, 1}));
  auto decoded = DecodeLayerJob(header, job.rows, Config());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->layer, job.layer);
  EXPECT_EQ(decoded->experts, job.experts);
  EXPECT_EQ(decoded->counts, job.counts);
  EXPECT_EQ(decoded->row_of, job.row_of);
  EXPECT_EQ(decoded->rows, job.rows);
}

TEST(ProtocolTest, ALayerResultRoundTripsWithTheRanksSeconds) {
  const std::vector<float> products = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<float> message = EncodeLayerResult({.products = products, .seconds = 0.25});
  auto decoded = DecodeLayerResult(message, 3, kLatent);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->products, products);
  EXPECT_EQ(decoded->seconds, 0.25);
}

TEST(ProtocolTest, AGuessAndAGreetingRoundTrip) {
  auto guess = DecodeLayerGuess(EncodeLayerGuess({.layer = 3, .experts = {1, 15}}), Config());
  ASSERT_TRUE(guess.ok()) << guess.status();
  EXPECT_EQ(guess->layer, 3);
  EXPECT_EQ(guess->experts, (std::vector<int32_t>{1, 15}));

  const WorkerInfo info{.capacity = {.cache_bytes = 1ull << 40, .disk_rate = 2.5e9},
                        .identity = {.simd_target = "AVX2", .checkpoint = "index, 10 bytes"}};
  auto back = DecodeWorkerInfo(EncodeWorkerInfo(info));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->error.empty());
  EXPECT_EQ(back->capacity.cache_bytes, info.capacity.cache_bytes);
  EXPECT_EQ(back->capacity.disk_rate, info.capacity.disk_rate);
  EXPECT_EQ(back->identity.simd_target, "AVX2");
  EXPECT_EQ(back->identity.checkpoint, "index, 10 bytes");
  auto failed = DecodeWorkerInfo(EncodeWorkerInfo({.error = "no such directory"}));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->error, "no such directory");
}

void ExpectGarbled(const absl::Status& s, const std::string& why) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr(why)) << s;
}

TEST(ProtocolTest, ATruncatedOrGarbledJobIsRefused) {
  const LayerJob job = Job();
  const std::vector<int64_t> header = EncodeJobHeader(job, kLatent);
  const std::span<const int64_t> whole(header);
  ExpectGarbled(DecodeLayerJob(whole.first(2), job.rows, Config()).status(), "a header of 2");
  ExpectGarbled(DecodeLayerJob(whole.first(9), job.rows, Config()).status(), "a header of 9");
  const std::vector<float> short_rows(job.rows.begin(), job.rows.end() - 1);
  ExpectGarbled(DecodeLayerJob(header, short_rows, Config()).status(), "5 floats of rows");
  auto with = [&](size_t at, int64_t value) {
    std::vector<int64_t> h = header;
    h[at] = value;
    return DecodeLayerJob(h, job.rows, Config()).status();
  };
  ExpectGarbled(with(0, 4), "layer 4 of a model of 4");
  ExpectGarbled(with(3, 16), "expert 16 of a layer of 16");
  ExpectGarbled(with(5, -1), "an expert of -1 rows");
  ExpectGarbled(with(9, 2), "row 2 of 2");
  ExpectGarbled(with(1, 1 << 20), "experts and 2 rows");
}

TEST(ProtocolTest, ATruncatedResultOrGarbledGuessOrGreetingIsRefused) {
  std::vector<float> message = EncodeLayerResult({.products = {1, 2, 3, 4, 5, 6}, .seconds = 1});
  message.pop_back();
  ExpectGarbled(DecodeLayerResult(message, 2, kLatent).status(),
                "6 floats for 2 products of 3 and the seconds");
  ExpectGarbled(DecodeLayerGuess({}, Config()).status(), "no layer");
  ExpectGarbled(DecodeLayerGuess(std::vector<int64_t>{1, -3}, Config()).status(), "expert -3");
  ExpectGarbled(DecodeWorkerInfo("{\"cache_bytes\": 1").status(), "not a JSON object");
  ExpectGarbled(DecodeWorkerInfo("{\"cache_bytes\": 1, \"disk_rate\": 0}").status(),
                "no \"simd_target\"");
}

TEST(IdentityTest, AnotherTargetOrCheckpointIsRefusedNamingTheRankAndBothValues) {
  const RankIdentity own{.simd_target = "AVX2", .checkpoint = "index, 10 bytes, xxh3 01"};
  EXPECT_TRUE(CheckLikeRank0(own, own, 1).ok());
  RankIdentity other = own;
  other.simd_target = "SSE4";
  absl::Status s = CheckLikeRank0(own, other, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("rank 1 on "));
  EXPECT_THAT(s.message(), HasSubstr("SIMD target SSE4 where rank 0 on "));
  EXPECT_THAT(s.message(), HasSubstr("runs them on AVX2"));
  other = own;
  other.checkpoint = "index, 11 bytes, xxh3 02";
  s = CheckLikeRank0(own, other, 2);
  EXPECT_THAT(s.message(), HasSubstr("opened checkpoint index, 11 bytes, xxh3 02 where rank 0"));
  EXPECT_THAT(s.message(), HasSubstr("opened index, 10 bytes, xxh3 01"));
}

}  // namespace
}  // namespace k3::ranks
