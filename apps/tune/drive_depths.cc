#include "apps/tune/drive_depths.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "apps/reports/drives.h"
#include "apps/reports/tables.h"
#include "apps/tune/tune_sweep.h"

namespace k3::cli::tune {

int KneeDepth(const std::vector<int>& depths, const std::vector<double>& gbps) {
  if (depths.empty() || depths.size() != gbps.size()) return 0;
  const double fastest = *std::max_element(gbps.begin(), gbps.end());
  for (size_t i = 0; i < depths.size(); ++i) {
    if (gbps[i] >= (1 - kMargin) * fastest) return depths[i];
  }
  return depths.back();
}

absl::StatusOr<std::vector<DriveDepths>> MeasureDriveDepths(const bench::Volume& v,
                                                            const std::vector<io::Volume>& volumes,
                                                            const io::StorageProfile& profile,
                                                            const std::vector<int>& depths,
                                                            int reads, int repeat, bool quiet) {
  auto drives = FindDrives(*v.checkpoint, volumes, profile);
  if (!drives.ok()) return drives.status();
  std::mt19937_64 rng(std::random_device{}());
  std::vector<DriveDepths> out;
  for (const Drive& d : *drives) {
    if (d.files() == 0) continue;  // the engine never reads it
    DriveDepths m{.id = d.id, .profile = d.profile.Describe(), .files = d.files()};
    for (const DriveDir& dir : d.dirs) m.dirs.push_back(dir.dir);
    auto gbps = bench::MeasureDrive(v, d.Copies(), d.profile, depths, reads, repeat, rng);
    if (gbps.ok()) {
      m.depths = depths;
      m.gbps = *std::move(gbps);
      m.depth = KneeDepth(m.depths, m.gbps);
    } else {
      m.skipped = std::string(gbps.status().message());
    }
    if (!quiet) {
      std::vector<std::string> rates;
      for (size_t i = 0; i < m.gbps.size(); ++i) {
        rates.push_back(absl::StrFormat("qd %d %.3f GB/s", m.depths[i], m.gbps[i]));
      }
      std::fprintf(stderr, "k3 tune: drive %s (%s): %s\n", m.id.c_str(), m.profile.c_str(),
                   m.skipped.empty() ? absl::StrJoin(rates, ", ").c_str() : m.skipped.c_str());
    }
    out.push_back(std::move(m));
  }
  return out;
}

int ChosenDepth(const std::vector<DriveDepths>& drives) {
  int depth = 0;
  for (const DriveDepths& d : drives) depth = std::max(depth, d.depth);
  return depth;
}

std::string DriveDepthsTable(const std::vector<DriveDepths>& drives) {
  std::vector<int> depths;
  for (const DriveDepths& d : drives) {
    if (d.depths.size() > depths.size()) depths = d.depths;
  }
  std::vector<std::string> header = {"drive", "directories", "profile", "files"};
  for (int depth : depths) header.push_back(absl::StrCat("GB/s at qd ", depth));
  header.push_back("rate stops growing at qd");
  MarkdownTable table(header);
  for (const DriveDepths& d : drives) {
    std::vector<std::string> cells = {d.id, absl::StrJoin(d.dirs, ", "), d.profile,
                                      absl::StrCat(d.files)};
    for (size_t i = 0; i < depths.size(); ++i) {
      cells.push_back(i < d.gbps.size() ? absl::StrFormat("%.3f", d.gbps[i]) : "-");
    }
    cells.push_back(d.skipped.empty() ? absl::StrCat(d.depth) : "- (" + d.skipped + ")");
    table.AddRow(cells);
  }
  return table.text();
}

nlohmann::json DriveDepthsJson(const std::vector<DriveDepths>& drives) {
  nlohmann::json out = nlohmann::json::array();
  for (const DriveDepths& d : drives) {
    out.push_back({{"id", d.id},
                   {"dirs", d.dirs},
                   {"profile", d.profile},
                   {"files", d.files},
                   {"depths", d.depths},
                   {"gbps", d.gbps},
                   {"queue_depth", d.depth},
                   {"skipped", d.skipped}});
  }
  return out;
}

}  // namespace k3::cli::tune
