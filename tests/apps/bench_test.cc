// k3 bench end to end on a tiny synthetic model: the sweep's table, CSV, JSON and SVG plot, the
// raw mode, and the flag checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

constexpr int kUsage = 2;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The markdown table's lines: header, rule, rows.
std::vector<std::string> TableLines(const std::string& out) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (absl::StartsWith(line, "|")) lines.emplace_back(line);
  }
  return lines;
}

// Whether an XML parser accepts the file: Python's minidom (always in the standard library),
// else xmllint; true when neither is present (the structural checks still run).
bool ParsesAsXml(const std::string& path) {
  const char* python = std::getenv("K3_PYTHON");
  std::string cmd;
  if (python != nullptr && std::system((testing::ShellQuote(python) + " -c pass").c_str()) == 0) {
    cmd = testing::ShellQuote(python) +
          " -c 'import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' ";
  } else if (std::system("xmllint --version >/dev/null 2>&1") == 0) {
    cmd = "xmllint --noout ";
  } else {
    return true;
  }
  return std::system((cmd + testing::ShellQuote(path)).c_str()) == 0;
}

class BenchTest : public testing::K3TinyModelSuite {};

TEST_F(BenchTest, SweepPrintsTableAndWritesCsvJsonAndPlot) {
  testing::TempDir out;
  auto r = RunK3({"bench", "--model", Model(), "--queue-depth", "1,4", "--prefetch-distance", "0,2",
                  "--tokens", "3", "--repeat", "1", "--reads", "8", "--out-csv", out / "b.csv",
                  "--out-json", out / "b.json", "--plot", out / "b.svg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const std::vector<std::string> table = TableLines(r.out);
  ASSERT_EQ(table.size(), 2u + 4u) << r.out;
  for (const char* column :
       {"volume", "profile", "queue depth", "prefetch distance", "s/token (median of 1)",
        "tokens/s", "GB/token", "raw GB/s", "x I/O floor", "stall", "hit rate",
        "prefetch precision", "prefetch recall"}) {
    EXPECT_THAT(table[0], HasSubstr(column));
  }
  EXPECT_THAT(r.err, HasSubstr("[4/4]"));  // progress names the combination

  const std::string csv = testing::ReadAll(out / "b.csv");
  std::vector<std::string> csv_lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(csv_lines.size(), 1u + 4u) << csv;
  EXPECT_TRUE(absl::StartsWith(csv_lines[0], "volume,profile,queue_depth,prefetch_distance,"));
  for (const std::string& line : csv_lines) {
    EXPECT_EQ(Count(line, ","), Count(csv_lines[0], ",")) << line;
  }

  const auto json = nlohmann::json::parse(testing::ReadAll(out / "b.json"));
  EXPECT_EQ(json["benchmark"], "decode");
  EXPECT_EQ(json["settings"]["tokens"], 3);
  EXPECT_EQ(json["raw"].size(), 2u);  // one raw cell per depth
  ASSERT_EQ(json["results"].size(), 4u);
  std::set<std::pair<int, int>> combinations;
  for (const auto& row : json["results"]) {
    for (const char* field : {"volume",
                              "profile",
                              "queue_depth",
                              "prefetch_distance",
                              "seconds_per_token",
                              "tokens_per_second",
                              "gb_per_token",
                              "gb_per_token_by_kind",
                              "raw_gbps",
                              "io_floor_seconds_per_token",
                              "ratio_to_io_floor",
                              "io_floor_gbps",
                              "io_floor_replays",
                              "io_floor_spread",
                              "io_floor_note",
                              "stall_fraction",
                              "disk_busy_fraction",
                              "hit_rate",
                              "prefetch_precision",
                              "prefetch_recall",
                              "prefill_seconds",
                              "engine_settings",
                              "memory_plan",
                              "runs"}) {
      EXPECT_TRUE(row.contains(field)) << field;
    }
    EXPECT_GT(row["seconds_per_token"].get<double>(), 0);
    EXPECT_GT(row["raw_gbps"].get<double>(), 0);
    EXPECT_EQ(row["runs"].size(), 1u);
    EXPECT_EQ(row["runs"][0]["decode"]["tokens"], 3);
    // Every setting decodes the same greedy tokens.
    EXPECT_EQ(row["runs"][0]["ids"], json["results"][0]["runs"][0]["ids"]);
    EXPECT_EQ(row["runs"][0]["ids"].size(), 3u);
    combinations.insert({row["queue_depth"].get<int>(), row["prefetch_distance"].get<int>()});
  }
  EXPECT_EQ(combinations, (std::set<std::pair<int, int>>{{1, 0}, {1, 2}, {4, 0}, {4, 2}}));

  const std::string svg = testing::ReadAll(out / "b.svg");
  EXPECT_TRUE(ParsesAsXml(out / "b.svg")) << svg;
  EXPECT_EQ(Count(svg, "<svg"), 1);
  EXPECT_EQ(Count(svg, "class=\"panel\""), 1);
  EXPECT_EQ(Count(svg, "<polyline"), 2);  // one line per prefetch distance
  EXPECT_EQ(Count(svg, "data-prefetch-distance=\"0\""), 1);
  EXPECT_EQ(Count(svg, "data-prefetch-distance=\"2\""), 1);
  EXPECT_THAT(svg, HasSubstr("queue depth"));
  EXPECT_THAT(svg, HasSubstr("s/token"));
}

// The floor is the run's own reads replayed, several times, the fastest replay counting. On
// emulated volumes the answer is known whatever the machine does (emulation only slows reads
// down): through a 20 MB/s pipe every replay takes at least bytes / 20 MB/s; at depth 1 with
// 1 ms per read, at least 1 ms per read. A row shows its ratio to the floor only when it is at
// least 1, and otherwise says why not (the rule itself, on made-up times: io_floor_test.cc).
TEST_F(BenchTest, TheFloorIsTheRunsOwnReadsReplayedOnTheSameVolume) {
  testing::TempDir out;
  auto r =
      RunK3({"bench", "--model", Model(), "--preset", "ultra", "--storage-profile",
             "bw=20MB/s,bw=1000MB/s,lat=1ms", "--queue-depth", "1,4", "--prefetch-distance", "0,2",
             "--tokens", "2", "--repeat", "1", "--reads", "4", "--out-json", out / "f.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(testing::ReadAll(out / "f.json"));
  ASSERT_EQ(json["results"].size(), 8u);
  std::set<std::string> profiles;
  for (const auto& row : json["results"]) {
    SCOPED_TRACE(row.dump());
    profiles.insert(row["profile"].get<std::string>());
    const auto& floor = row["runs"][0]["io_floor"];
    const double bytes = floor["bytes"].get<double>();
    const double read = row["gb_per_token"].get<double>() * 2 * 1e9;
    // The replay reads what the run read (the run also counts reads in flight at its end).
    EXPECT_GT(bytes, 0.9 * read);
    EXPECT_LE(bytes, 1.01 * read);
    EXPECT_EQ(floor["concurrency"], row["queue_depth"]);
    const std::vector<double> replays = floor["replay_seconds"].get<std::vector<double>>();
    ASSERT_GE(replays.size(), 3u);
    EXPECT_LE(replays.size(), 6u);
    EXPECT_EQ(row["io_floor_replays"], replays.size());
    const double seconds = floor["seconds"].get<double>();
    EXPECT_EQ(seconds, *std::min_element(replays.begin(), replays.end()));
    if (row["profile"] == "bw=20MB/s") {
      EXPECT_GE(seconds, bytes / 20e6);
    } else if (row["queue_depth"] == 1) {
      EXPECT_GE(seconds, floor["reads"].get<double>() * 1e-3);
    }
    EXPECT_DOUBLE_EQ(row["io_floor_seconds_per_token"].get<double>(), seconds / 2);
    if (row["ratio_to_io_floor"].is_null()) {
      EXPECT_NE(row["io_floor_note"], "");
    } else {
      EXPECT_EQ(row["io_floor_note"], "");
      EXPECT_DOUBLE_EQ(row["ratio_to_io_floor"].get<double>(),
                       row["runs"][0]["decode"]["seconds"].get<double>() / seconds);
      EXPECT_GE(row["ratio_to_io_floor"].get<double>(), 1);
    }
  }
  EXPECT_EQ(profiles, (std::set<std::string>{"bw=20MB/s", "bw=1000MB/s,lat=1ms"}));
}

TEST_F(BenchTest, PlotHasAPanelPerStorageProfile) {
  testing::TempDir out;
  auto r = RunK3({"bench", "--model", Model(), "--storage-profile", "direct,lat=20us",
                  "--queue-depth", "2", "--prefetch-distance", "1", "--tokens", "2", "--repeat",
                  "1", "--reads", "4", "--quiet", "--plot", out / "p.svg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(TableLines(r.out).size(), 2u + 2u) << r.out;
  const std::string svg = testing::ReadAll(out / "p.svg");
  EXPECT_TRUE(ParsesAsXml(out / "p.svg")) << svg;
  EXPECT_EQ(Count(svg, "class=\"panel\""), 2);
  EXPECT_EQ(Count(svg, "<polyline"), 2);
  EXPECT_THAT(svg, HasSubstr("lat=20us"));
}

TEST_F(BenchTest, RawMeasuresEachDepth) {
  testing::TempDir out;
  auto r = RunK3({"bench", "--raw", "--model", Model(), "--queue-depth", "1,2", "--repeat", "1",
                  "--reads", "8", "--nofio", "--quiet", "--out-json", out / "raw.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(TableLines(r.out).size(), 2u + 2u) << r.out;
  const auto json = nlohmann::json::parse(testing::ReadAll(out / "raw.json"));
  EXPECT_EQ(json["benchmark"], "raw");
  ASSERT_EQ(json["results"].size(), 2u);
  EXPECT_GT(json["results"][0]["gbps_median"].get<double>(), 0);
}

struct BadFlags {
  const char* name;
  std::vector<std::string> args;  // "MODEL" is replaced by the tiny model's directory
  const char* message;
};
void PrintTo(const BadFlags& c, std::ostream* os) { *os << c.name; }

class BenchFlagTest : public BenchTest, public ::testing::WithParamInterface<BadFlags> {};

TEST_P(BenchFlagTest, ExitsTwoWithAOneLineMessageNamingTheFlag) {
  std::vector<std::string> args = {"bench"};
  for (const std::string& a : GetParam().args) args.push_back(a == "MODEL" ? Model() : a);
  auto r = RunK3(args);
  EXPECT_EQ(r.exit_code, kUsage) << r.err;
  EXPECT_THAT(r.err, HasSubstr(GetParam().message));
  EXPECT_EQ(Count(r.err, "\n"), 1) << r.err;
}

const BadFlags kBadFlags[] = {
    {"no_model", {"--tokens", "3"}, "--model DIR"},
    {"empty_model_list", {"--model", ","}, "--model: no model directory"},
    {"not_a_model", {"--model", "/nonexistent/k3"}, "--model /nonexistent/k3"},
    {"bad_depth", {"--model", "MODEL", "--queue-depth", "1,x"}, "--queue-depth x"},
    {"zero_depth", {"--model", "MODEL", "--queue-depth", "0"}, "--queue-depth 0"},
    {"bad_distance", {"--model", "MODEL", "--prefetch-distance", "-1"}, "--prefetch-distance -1"},
    {"unknown_profile", {"--model", "MODEL", "--storage-profile", "floppy"}, "--storage-profile"},
    {"one_token", {"--model", "MODEL", "--tokens", "1"}, "--tokens must be at least 2"},
    {"no_repeat", {"--model", "MODEL", "--repeat", "0"}, "--repeat must be at least 1"},
    {"plot_with_raw", {"--model", "MODEL", "--raw", "--plot", "x.svg"}, "--plot"},
};

INSTANTIATE_TEST_SUITE_P(All, BenchFlagTest, ::testing::ValuesIn(kBadFlags),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace k3
