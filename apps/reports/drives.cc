#include "apps/reports/drives.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/stripe.h"
#include "io/file.h"

namespace k3::cli {
namespace {

// The copies of the checkpoint's shards in `dir`, by name, each checked against the original.
DriveDir Holdings(const Checkpoint& ckpt, const std::string& dir, io::CopyCheck check) {
  DriveDir d{.dir = dir};
  for (const std::string& original : ckpt.shard_paths()) {
    const std::string copy = io::JoinPath(dir, std::filesystem::path(original).filename());
    std::error_code ec;
    if (!std::filesystem::is_regular_file(copy, ec)) {
      d.copies.emplace_back();
      continue;
    }
    if (absl::Status s = io::CheckCopy(original, copy, check); !s.ok()) {
      d.differs.emplace_back(s.message());
      d.copies.emplace_back();
      continue;
    }
    d.copies.push_back(copy);
    ++d.files;
    d.bytes += std::filesystem::file_size(copy, ec);
  }
  d.stripes = io::FileExists(io::JoinPath(dir, kStripeManifestFile));
  return d;
}

}  // namespace

std::vector<std::string> Drive::Copies() const {
  std::vector<std::string> out;
  for (const DriveDir& d : dirs) {
    out.resize(std::max(out.size(), d.copies.size()));
    for (size_t i = 0; i < d.copies.size(); ++i) {
      if (out[i].empty()) out[i] = d.copies[i];
    }
  }
  return out;
}

int Drive::files() const {
  const std::vector<std::string> copies = Copies();
  return static_cast<int>(
      std::count_if(copies.begin(), copies.end(), [](const std::string& c) { return !c.empty(); }));
}

absl::StatusOr<std::vector<Drive>> FindDrives(const Checkpoint& ckpt,
                                              const std::vector<io::Volume>& volumes,
                                              const io::StorageProfile& profile,
                                              io::CopyCheck check) {
  std::vector<Drive> drives;
  // The model's directory first: its files are the originals.
  DriveDir model{.dir = ckpt.dir(), .copies = ckpt.shard_paths()};
  model.files = static_cast<int>(model.copies.size());
  for (const std::string& path : model.copies) {
    std::error_code ec;
    model.bytes += std::filesystem::file_size(path, ec);
  }
  model.stripes = io::FileExists(io::JoinPath(ckpt.dir(), kStripeManifestFile));
  std::vector<std::pair<DriveDir, io::Volume>> dirs = {{model, io::Volume{.dir = ckpt.dir()}}};
  for (const io::Volume& v : volumes) {
    DriveDir d = Holdings(ckpt, v.dir, check);
    d.spec = v.spec;
    dirs.emplace_back(std::move(d), v);
  }
  for (auto& entry : dirs) {
    DriveDir& dir = entry.first;
    const io::Volume& volume = entry.second;
    std::string id = volume.dir;  // a drive of its own
    if (!volume.profile) {
      struct stat st {};
      if (::stat(volume.dir.c_str(), &st) != 0) {
        return absl::NotFoundError(absl::StrCat(volume.dir, ": cannot stat the directory"));
      }
      id = absl::StrCat(major(st.st_dev), ":", minor(st.st_dev));
    }
    auto it = std::find_if(drives.begin(), drives.end(),
                           [&](const Drive& d) { return d.id == id && !volume.profile; });
    if (it == drives.end()) {
      it =
          drives.insert(drives.end(), Drive{.id = id, .profile = volume.profile.value_or(profile)});
    }
    it->dirs.push_back(std::move(dir));
  }
  return drives;
}

}  // namespace k3::cli
