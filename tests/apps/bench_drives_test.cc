// k3 bench and k3 tune over several drives: a tiny model whose shards are also in two --volume
// directories with profiles of their own (hard links: each such directory is a drive of its
// own). The rows, columns and JSON fields that say which drives a row read and what each did,
// and that they agree with each other; never a time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"
#include "tests/util/volume_dirs.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::RunK3;

// The cells of a markdown table's lines (header first, the rule left out).
std::vector<std::vector<std::string>> TableCells(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "|") || absl::StartsWith(line, "|---")) continue;
    std::vector<std::string> cells;
    for (absl::string_view cell : absl::StrSplit(line.substr(1, line.size() - 2), '|')) {
      cells.emplace_back(absl::StripAsciiWhitespace(cell));
    }
    rows.push_back(cells);
  }
  return rows;
}

int Column(const std::vector<std::string>& header, const std::string& name) {
  auto it = std::find(header.begin(), header.end(), name);
  EXPECT_NE(it, header.end()) << name;
  return static_cast<int>(it - header.begin());
}

uint64_t DeviceBytes(const nlohmann::json& devices) {
  uint64_t sum = 0;
  for (const auto& d : devices) sum += d["bytes"].get<uint64_t>();
  return sum;
}

class DrivesTest : public testing::K3TinyModelSuite {
 protected:
  void SetUp() override {
    shards_ = testing::LinkShards(Model(), dir_ / "a");
    testing::LinkShards(Model(), dir_ / "b");
  }
  std::string A() const { return dir_ / "a"; }
  std::string B() const { return dir_ / "b"; }

  testing::TempDir dir_;
  int shards_ = 0;
};

// --sweep-volumes: the model's directory alone, then with a, then with a and b: one, two and
// three drives. Each row's drives are in the table, the JSON (with what each did over the decode
// steps, summing to the row's bytes) and the CSV; the floor replays the reads over the same
// drives; the plot has a panel per drive count.
TEST_F(DrivesTest, SweepVolumesAddsADriveARow) {
  testing::TempDir out;
  const std::string a = A() + "@bw=2000MB/s", b = B() + "@bw=2000MB/s";
  auto r = RunK3({"bench",
                  "--model",
                  Model(),
                  "--preset",
                  "ultra",
                  "--volume",
                  a,
                  "--volume",
                  b,
                  "--sweep-volumes",
                  "--queue-depth",
                  "4",
                  "--prefetch-distance",
                  "0",
                  "--tokens",
                  "2",
                  "--repeat",
                  "1",
                  "--reads",
                  "4",
                  "--out-json",
                  out / "d.json",
                  "--out-csv",
                  out / "d.csv",
                  "--plot",
                  out / "d.svg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  const auto table = TableCells(r.out);
  ASSERT_EQ(table.size(), 1u + 3u) << r.out;
  const int volumes_column = Column(table[0], "+volumes");
  const int drives_column = Column(table[0], "drives");
  EXPECT_EQ(volumes_column, 1);  // after the volume (model directory)
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(table[1 + i][volumes_column], std::to_string(i)) << r.out;
    EXPECT_EQ(table[1 + i][drives_column], std::to_string(i + 1)) << r.out;
  }
  EXPECT_THAT(r.err, HasSubstr(" +2 volumes direct qd 4"));  // progress names the set

  const auto json = nlohmann::json::parse(testing::ReadAll(out / "d.json"));
  EXPECT_EQ(json["settings"]["volumes"], nlohmann::json({a, b}));
  EXPECT_TRUE(json["settings"]["sweep_volumes"].get<bool>());
  EXPECT_EQ(json["raw"].size(), 3u);  // the raw cell of each set
  ASSERT_EQ(json["results"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = json["results"][i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["volume_flags"].size(), i);
    EXPECT_EQ(row["drives"], i + 1);
    EXPECT_EQ(json["raw"][i]["drives"], i + 1);
    EXPECT_EQ(json["raw"][i]["volume_flags"], row["volume_flags"]);
    ASSERT_EQ(row["devices"].size(), i + 1);
    std::set<std::string> ids;
    for (const auto& d : row["devices"]) ids.insert(d["id"].get<std::string>());
    EXPECT_EQ(ids.contains(A()), i >= 1);
    EXPECT_EQ(ids.contains(B()), i >= 2);
    ASSERT_EQ(row["runs"].size(), 1u);
    const auto& run = row["runs"][0];
    // The row's devices are its runs' (one run here); they read what the decode steps read
    // (give or take a read in flight across the prefill's end or the last step's).
    EXPECT_EQ(DeviceBytes(row["devices"]), DeviceBytes(run["devices"]));
    uint64_t read = 0;
    for (const auto& [kind, bytes] : run["decode"]["bytes_read"].items()) {
      read += bytes.get<uint64_t>();
    }
    EXPECT_GT(read, 0u);
    EXPECT_GE(DeviceBytes(run["devices"]), 0.9 * static_cast<double>(read));
    EXPECT_LE(DeviceBytes(run["devices"]), 1.1 * static_cast<double>(read));
    // The floor is the same reads over the same drives: every byte of the fastest replay came
    // from one of them.
    EXPECT_EQ(run["io_floor"]["drives"], i + 1);
    EXPECT_EQ(DeviceBytes(run["io_floor"]["devices"]), run["io_floor"]["bytes"].get<uint64_t>());
  }

  const std::string csv = testing::ReadAll(out / "d.csv");
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u + 3u) << csv;
  EXPECT_TRUE(absl::EndsWith(lines[0],
                             ",drives,volume_flags,drive_ids,drive_bytes,drive_busy_fractions,"
                             "drive_gbps"))
      << lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    // The paths hold no commas: every cell splits cleanly. The drive lists have an entry per
    // drive, and the bytes add up to the JSON's.
    const std::vector<std::string> cells = absl::StrSplit(lines[i], ',');
    ASSERT_EQ(cells.size(), std::vector<std::string>(absl::StrSplit(lines[0], ',')).size());
    const size_t n = cells.size();
    EXPECT_EQ(cells[n - 6], std::to_string(i));
    uint64_t bytes = 0;
    std::string list = cells[n - 3];
    list.erase(std::remove(list.begin(), list.end(), '"'), list.end());
    std::vector<std::string> entries = absl::StrSplit(list, ';');
    EXPECT_EQ(entries.size(), i);
    for (const std::string& e : entries) bytes += std::stoull(e);
    EXPECT_EQ(bytes, DeviceBytes(json["results"][i - 1]["devices"]));
  }

  const std::string svg = testing::ReadAll(out / "d.svg");
  EXPECT_THAT(svg, HasSubstr("direct \xC2\xB7 1 drive<"));
  EXPECT_THAT(svg, HasSubstr("direct \xC2\xB7 2 drives<"));
  EXPECT_THAT(svg, HasSubstr("direct \xC2\xB7 3 drives<"));
}

// Without --sweep-volumes every row reads every volume; the raw bench reads through them too,
// and with --sweep-volumes it measures each set.
TEST_F(DrivesTest, EveryRowReadsEveryVolumeAndRawReadsTheSet) {
  testing::TempDir out;
  const std::string a = A() + "@bw=2000MB/s", b = B() + "@bw=2000MB/s";
  auto r = RunK3({"bench",
                  "--model",
                  Model(),
                  "--preset",
                  "ultra",
                  "--volume",
                  a,
                  "--volume",
                  b,
                  "--queue-depth",
                  "1,2",
                  "--prefetch-distance",
                  "0",
                  "--tokens",
                  "2",
                  "--repeat",
                  "1",
                  "--reads",
                  "4",
                  "--quiet",
                  "--out-json",
                  out / "all.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto json = nlohmann::json::parse(testing::ReadAll(out / "all.json"));
  ASSERT_EQ(json["results"].size(), 2u);
  for (const auto& row : json["results"]) {
    EXPECT_EQ(row["volume_flags"], nlohmann::json({a, b}));
    EXPECT_EQ(row["drives"], 3);
    EXPECT_EQ(row["devices"].size(), 3u);
  }

  r = RunK3({"bench", "--raw", "--model", Model(), "--volume", a, "--volume", b, "--sweep-volumes",
             "--queue-depth", "1,2", "--repeat", "1", "--reads", "4", "--quiet", "--out-json",
             out / "raw.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto table = TableCells(r.out);
  ASSERT_EQ(table.size(), 1u + 6u) << r.out;
  const int drives_column = Column(table[0], "drives");
  const auto raw = nlohmann::json::parse(testing::ReadAll(out / "raw.json"));
  ASSERT_EQ(raw["results"].size(), 6u);
  const uint64_t expert_bytes = raw["volumes"][0]["expert_bytes"];
  for (size_t i = 0; i < 6; ++i) {
    const auto& row = raw["results"][i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["queue_depth"], 1 + i % 2);
    EXPECT_EQ(row["drives"], 1 + i / 2);
    EXPECT_EQ(table[1 + i][drives_column], std::to_string(1 + i / 2));
    EXPECT_EQ(row["devices"].size(), 1 + i / 2);
    // Whole experts (the tiny model's are all of one size), 4 in the one run.
    EXPECT_EQ(DeviceBytes(row["devices"]), 4 * expert_bytes);
  }
}

TEST_F(DrivesTest, SweepVolumesWithoutAVolumeIsAUsageError) {
  auto r = RunK3({"bench", "--model", Model(), "--sweep-volumes", "--tokens", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--sweep-volumes needs at least one --volume"));
  r = RunK3({"bench", "--model", Model(), "--volume", "/nonexistent/k3-volume"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--volume /nonexistent/k3-volume"));
}

// k3 tune with three drives: each read alone at every depth of the list, a depth each where its
// rate stops growing, and the largest of them taken for --queue-depth (the engine keeps one for
// every drive) instead of a decode sweep of it; the settings file keeps the per-drive figures.
TEST_F(DrivesTest, TuneGivesEachDriveADepthAndTakesTheLargest) {
  testing::TempDir out;
  auto r = RunK3({"tune",
                  "--model",
                  Model(),
                  "--volume",
                  A() + "@bw=2000MB/s",
                  "--volume",
                  B() + "@bw=500MB/s",
                  "--queue-depth",
                  "1,4",
                  "--prefetch-distance",
                  "0",
                  "--thread-counts",
                  "0",
                  "--tokens",
                  "2",
                  "--repeat",
                  "1",
                  "--reads",
                  "8",
                  "--out",
                  out / "s.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("3 drives, each read alone"));
  EXPECT_THAT(r.out, HasSubstr("| GB/s at qd 1 | GB/s at qd 4 | rate stops growing at qd |"));
  const auto file = nlohmann::json::parse(testing::ReadAll(out / "s.json"));
  const auto& drives = file["profiles"]["direct"]["drives"];
  ASSERT_EQ(drives["per_drive"].size(), 3u) << file.dump();
  int largest = 0;
  std::set<std::string> ids;
  for (const auto& d : drives["per_drive"]) {
    SCOPED_TRACE(d.dump());
    ids.insert(d["id"].get<std::string>());
    EXPECT_EQ(d["depths"], nlohmann::json({1, 4}));
    ASSERT_EQ(d["gbps"].size(), 2u);
    for (const auto& g : d["gbps"]) EXPECT_GT(g.get<double>(), 0);
    EXPECT_TRUE(d["queue_depth"] == 1 || d["queue_depth"] == 4);
    EXPECT_EQ(d["files"], shards_);  // every drive holds every shard
    largest = std::max(largest, d["queue_depth"].get<int>());
  }
  EXPECT_TRUE(ids.contains(A()) && ids.contains(B()));
  EXPECT_EQ(drives["queue_depth"], largest);
  EXPECT_THAT(r.out, HasSubstr("| queue-depth | " + std::to_string(largest) +
                               " | - | - | 0 | - | chosen: the largest of the drives' depths"));
  // The flags: that depth, unless the confirming run found the pick no faster than the defaults.
  if (r.out.find("the defaults stay") == std::string::npos) {
    EXPECT_EQ(file["flags"]["queue-depth"], std::to_string(largest));
  }
}

}  // namespace
}  // namespace k3
