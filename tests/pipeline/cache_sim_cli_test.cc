// `k3 cache-sim` end to end: the table and the JSON on the recorded trace, and its usage and
// input errors (exit 2 with a message that names the problem).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "nlohmann/json.hpp"
#include "pipeline/cache/trace.h"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

constexpr int kUsage = 2;

std::string RecordedTrace() { return testing::SharedDir() + "/traces/kimi-k3-expert-trace.bin"; }

TEST(CacheSimCliTest, PrintsTheTableAndWritesTheJson) {
  testing::TempDir dir;
  const std::string json_path = dir / "sim.json";
  auto r = RunK3({"cache-sim", "--trace", RecordedTrace(), "--capacity-gb", "8,64", "--policy",
                  "lru,belady,default", "--out-json", json_path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("| policy | 8 GB | 64 GB |"));
  EXPECT_THAT(r.out, HasSubstr("| lru | 36.24 % | 36.24 % |"));
  EXPECT_THAT(r.out, HasSubstr("| belady | 39.42 % | 61.74 % |"));
  EXPECT_THAT(r.out, HasSubstr("| layer-reuse |"));
  EXPECT_THAT(r.err, HasSubstr("8 GB = 455"));

  auto json = nlohmann::json::parse(testing::ReadAll(json_path), nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_NEAR(json["lru"]["8"].get<double>(), 0.3624, 1e-4);
  EXPECT_NEAR(json["belady"]["64"].get<double>(), 0.6174, 1e-4);
  const double ours = json["layer-reuse"]["64"].get<double>();
  EXPECT_GE(ours, 0.9 * json["belady"]["64"].get<double>());
}

TEST(CacheSimCliTest, ExpertBytesSetsTheSlotCount) {
  testing::TempDir dir;
  const std::string path = dir / "t.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << EncodeExpertTrace({{1, 1}, {1, 2}, {1, 1}, {1, 3}, {1, 2}, {1, 1}});
  }
  auto r = RunK3({"cache-sim", "--trace", path, "--expert-bytes", "1000000000", "--capacity-gb",
                  "2.5,3", "--policy", "lru"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 2 slots: 1 2 1(hit) 3 2 1 -> 1 hit of 6; 3 slots: 1 2 1 3 2 1 -> 3 hits of 6.
  EXPECT_THAT(r.out, HasSubstr("| lru | 16.67 % | 50.00 % |"));
}

struct ErrorCase {
  const char* name;
  std::vector<std::string> args;  // after "cache-sim"; "TRACE" stands for the recorded trace
  const char* message;
};

class CacheSimErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(CacheSimErrorTest, ExitsTwoWithAMessage) {
  std::vector<std::string> args = {"cache-sim"};
  for (const std::string& a : GetParam().args) args.push_back(a == "TRACE" ? RecordedTrace() : a);
  auto r = RunK3(args);
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Usage, CacheSimErrorTest,
    ::testing::Values(
        ErrorCase{"NoTrace", {"--capacity-gb", "8"}, "--trace FILE is required"},
        ErrorCase{"BadCapacity", {"--trace", "TRACE", "--capacity-gb", "8,abc"}, "'abc'"},
        ErrorCase{"NegativeCapacity", {"--trace", "TRACE", "--capacity-gb", "-8"}, "'-8'"},
        ErrorCase{
            "TinyCapacity", {"--trace", "TRACE", "--capacity-gb", "0.001"}, "holds no expert"},
        ErrorCase{"UnknownPolicy", {"--trace", "TRACE", "--policy", "lru,nope"}, "'nope'"},
        ErrorCase{"BadExpertBytes", {"--trace", "TRACE", "--expert-bytes", "0"}, "--expert-bytes"},
        ErrorCase{"UnknownFlag", {"--trace", "TRACE", "--model", "x"}, "--model"},
        ErrorCase{"MissingFile", {"--trace", "/nonexistent/k3-trace.bin"}, "k3-trace.bin"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CacheSimCliTest, MalformedTracesNameTheFileAndTheProblem) {
  testing::TempDir dir;
  {
    std::ofstream out(dir / "odd.bin", std::ios::binary);
    out << std::string(12, '\1');
  }
  auto odd = RunK3({"cache-sim", "--trace", dir / "odd.bin"});
  EXPECT_EQ(odd.exit_code, kUsage);
  EXPECT_THAT(odd.err, HasSubstr("odd.bin"));
  EXPECT_THAT(odd.err, HasSubstr("12 bytes"));
  {
    std::ofstream out(dir / "neg.bin", std::ios::binary);
    out << EncodeExpertTrace({{1, 1}, {-2, 5}});
  }
  auto neg = RunK3({"cache-sim", "--trace", dir / "neg.bin"});
  EXPECT_EQ(neg.exit_code, kUsage);
  EXPECT_THAT(neg.err, HasSubstr("neg.bin"));
  EXPECT_THAT(neg.err, HasSubstr("negative"));
}

TEST(CacheSimCliTest, HelpDescribesTheFlags) {
  auto r = RunK3({"cache-sim", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--capacity-gb"));
  EXPECT_THAT(r.out, HasSubstr("--out-json"));
}

}  // namespace
}  // namespace k3
