#include "io/volume.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/file.h"

namespace k3::io {

absl::StatusOr<Volume> ParseVolume(std::string_view spec) {
  // The profile follows the last '@', so that a directory may hold one (a profile never does).
  const size_t at = spec.rfind('@');
  Volume v{.dir = std::string(spec.substr(0, at)), .spec = std::string(spec)};
  while (v.dir.size() > 1 && v.dir.back() == '/') v.dir.pop_back();
  if (v.dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--volume '", std::string(spec), "': expected DIR or DIR@PROFILE"));
  }
  if (at != std::string_view::npos) {
    auto profile = ParseStorageProfile(spec.substr(at + 1));
    if (!profile.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--volume ", std::string(spec), ": ",
                                                     std::string(profile.status().message())));
    }
    v.profile = *profile;
  }
  return v;
}

std::vector<std::string> JoinVolumeParts(const std::vector<std::string>& parts) {
  std::vector<std::string> specs;
  for (const std::string& part : parts) {
    const bool setting = part.rfind("lat=", 0) == 0 || part.rfind("bw=", 0) == 0 ||
                         part.rfind("iops=", 0) == 0 || part.rfind("qd=", 0) == 0;
    if (setting && !specs.empty() && specs.back().find('@') != std::string::npos) {
      absl::StrAppend(&specs.back(), ",", part);
    } else {
      specs.push_back(part);
    }
  }
  return specs;
}

std::vector<std::string> VolumeSpecs(const std::vector<Volume>& volumes) {
  std::vector<std::string> specs;
  for (const Volume& v : volumes) specs.push_back(v.spec);
  return specs;
}

namespace {

constexpr uint64_t kHeadBytes = 64 << 10;
constexpr int kSamples = 16;
constexpr uint64_t kSampleBytes = 4096;
constexpr uint64_t kBlockBytes = 8 << 20;

absl::Status Differs(const std::string& original, const std::string& copy, uint64_t at) {
  return absl::FailedPreconditionError(absl::StrCat(copy, " differs from ", original, " at offset ",
                                                    at, " (a stale or damaged copy?)"));
}

// Compares [offset, offset + length) of both files; OK or the first differing offset.
absl::Status CompareRange(const RandomAccessFile& a, const RandomAccessFile& b, uint64_t offset,
                          uint64_t length, std::vector<uint8_t>& x, std::vector<uint8_t>& y) {
  x.resize(length);
  y.resize(length);
  if (absl::Status s = a.ReadAt(offset, x); !s.ok()) return s;
  if (absl::Status s = b.ReadAt(offset, y); !s.ok()) return s;
  if (std::memcmp(x.data(), y.data(), length) == 0) return absl::OkStatus();
  const auto diff = std::mismatch(x.begin(), x.end(), y.begin());
  return Differs(a.path(), b.path(), offset + static_cast<uint64_t>(diff.first - x.begin()));
}

}  // namespace

absl::Status CheckCopy(const std::string& original, const std::string& copy, CopyCheck check,
                       const std::function<void(uint64_t, uint64_t)>& progress) {
  auto a = RandomAccessFile::Open(original);
  if (!a.ok()) return a.status();
  auto b = RandomAccessFile::Open(copy);
  if (!b.ok()) return b.status();
  const uint64_t size = (*a)->size();
  if ((*b)->size() != size) {
    return absl::FailedPreconditionError(
        absl::StrCat(copy, " is ", (*b)->size(), " bytes where ", original, " is ", size));
  }
  if (check == CopyCheck::kSize) return absl::OkStatus();
  std::vector<uint8_t> x, y;
  if (check == CopyCheck::kFull) {
    for (uint64_t at = 0; at < size; at += kBlockBytes) {
      const uint64_t n = std::min(kBlockBytes, size - at);
      if (absl::Status s = CompareRange(**a, **b, at, n, x, y); !s.ok()) return s;
      if (progress) progress(at + n, size);
    }
    return absl::OkStatus();
  }
  if (absl::Status s = CompareRange(**a, **b, 0, std::min(size, kHeadBytes), x, y); !s.ok()) {
    return s;
  }
  // Samples spread evenly, each at a block boundary: where a copy cut short, or a piece of
  // another checkpoint's file, would show.
  for (int i = 0; i < kSamples && size > kHeadBytes; ++i) {
    const uint64_t at = AlignDown(kHeadBytes + (size - kHeadBytes) / kSamples * i);
    const uint64_t n = std::min(kSampleBytes, size - at);
    if (absl::Status s = CompareRange(**a, **b, at, n, x, y); !s.ok()) return s;
  }
  if (size > kSampleBytes) {
    const uint64_t tail = size - std::min(size, kSampleBytes);
    if (absl::Status s = CompareRange(**a, **b, tail, size - tail, x, y); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace k3::io
